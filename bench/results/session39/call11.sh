# Session 39, call 11: the whole CUDA-graph GPU test file on the session's final code (after guided look-ahead, QA fixes).
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
timeout -s KILL 400 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1
tail -n 15 $OUT/test_graphs.log | grep -E "passed|failed|Error|assert" | head -20
