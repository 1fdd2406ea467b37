# Session 38, call 7: structured output (response_format → a JSON schema's token masks, cluster/guided.py) on the GPU
# path — bf16, CUDA graphs, the Triton kernels — with xgrammar installed from wheels carried in (the image lacks it).
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1; tail -n 2 $OUT/pip.log
timeout -s KILL 300 python -m pytest -q tests/gpu/test_graphs_gpu.py -k structured > $OUT/test_guided.log 2>&1
tail -n 15 $OUT/test_guided.log
