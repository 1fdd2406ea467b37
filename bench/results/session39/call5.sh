# Session 39, call 5: the CUDA-graph GPU tests on this session's final engine code (seeded drawn speculation ==
# plain decoding; structured output with the masks built during the forward and copied without a sync; a waiting
# guide with graph drafting and with look-ahead == plain). xgrammar from the wheels carried in.
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
timeout -s KILL 400 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1
tail -n 15 $OUT/test_graphs.log | grep -E "passed|failed|Error|assert" | head -20
