# Session 39, call 9: guided steps now launch ahead (sampling deferred to the next step's masks): the graph tests'
# structured / guided / look-ahead cases, then structured output's step cost on the slice again (as call 4).
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
timeout -s KILL 200 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "structured or guided or lookahead" > $OUT/test_graphs.log 2>&1
tail -n 15 $OUT/test_graphs.log | grep -E "passed|failed|Error|assert" | head -10
timeout -s KILL 300 python bench/guided_gpu.py --rows 1 8 --tokens 48 --vocab code --out $OUT > $OUT/guided_gpu.log 2>&1
tail -n 4 $OUT/guided_gpu.log
