# Session 39, call 10: call 9's bench again with the guided modes looking ahead as served (call 9 ran them without).
export PYTHONPATH=/tmp/xg:.
pip install -q --no-deps --target /tmp/xg .wheels/*.whl > $OUT/pip.log 2>&1
timeout -s KILL 240 python bench/guided_gpu.py --rows 1 8 --tokens 48 --vocab code --out $OUT > $OUT/guided_gpu.log 2>&1
tail -n 4 $OUT/guided_gpu.log
