# Session 39, call 1: the CUDA-graph GPU tests (seeded drawn speculation on captured drafting == plain decoding;
# structured output on graph steps with the masks built during the forward), then structured output's step cost on
# the GLM-5.2-width slice: masks built during the forward vs before the step. xgrammar from the wheels carried in.
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1; tail -n 2 $OUT/pip.log
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout -s KILL 260 python -m pytest -q tests/gpu/test_graphs_gpu.py -s > $OUT/test_graphs.log 2>&1
grep -E "passed|failed|Error|accepted drafts" $OUT/test_graphs.log | tail -n 8
timeout -s KILL 300 python bench/guided_gpu.py --rows 1 8 --tokens 48 --out $OUT > $OUT/guided_gpu.log 2>&1
tail -n 8 $OUT/guided_gpu.log
