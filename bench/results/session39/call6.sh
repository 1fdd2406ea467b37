# Session 39, call 6 (and 7, after the structured test's stale "no drafts" assertion went): guided requests now draft
# structured-output, guided-drafting and drawn-speculation cases on the GPU path. xgrammar from the wheels carried in.
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
timeout -s KILL 300 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "structured or guided or drawn or speculative" > $OUT/test_graphs.log 2>&1
tail -n 15 $OUT/test_graphs.log | grep -E "passed|failed|Error|assert" | head -20
