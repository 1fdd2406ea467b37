# Session 38, call 8: structured output's grammar work on a 16-core host (the engine's masks of 8 rows one at a time
# against together on xgrammar's threads), CPU only; xgrammar from the wheels carried in.
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
nproc
timeout -s KILL 200 python bench/guided_cpu.py --grammar-only --out $OUT/guided_cpu.md 2>&1 | tail -n 12
