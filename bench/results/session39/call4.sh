# Session 39, call 4: structured output's step on the slice after allow_only lost its device row index (a synchronous
# copy from a Python list: the host waited for the forward before launching the masking and sampling); the graph
# tests' structured-output cases. xgrammar from the wheels carried in.
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
timeout -s KILL 120 python -m pytest -q tests/gpu/test_graphs_gpu.py -k structured > $OUT/test_guided.log 2>&1
tail -n 2 $OUT/test_guided.log
timeout -s KILL 300 python bench/guided_gpu.py --rows 1 8 --tokens 48 --vocab code --out $OUT > $OUT/guided_gpu.log 2>&1
tail -n 5 $OUT/guided_gpu.log
