# Session 39, call 2: structured output's step cost on the GLM-5.2-width slice with a real BPE of GLM-5's size
# (trained here on the host's Python sources) — masks during the forward vs before the step — and the grammar's host
# work on this host's CPU for the three vocabularies. xgrammar from the wheels carried in.
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
nproc; lscpu | grep -E "Model name|MHz" | head -3
timeout -s KILL 250 python bench/guided_cpu.py --grammar-only --out $OUT/guided_cpu.md > $OUT/guided_cpu.log 2>&1
tail -n 14 $OUT/guided_cpu.log
timeout -s KILL 300 python bench/guided_gpu.py --rows 1 8 --tokens 48 --vocab code --out $OUT > $OUT/guided_gpu.log 2>&1
tail -n 5 $OUT/guided_gpu.log
