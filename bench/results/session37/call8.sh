# Session 37, call 8: the split-lm_head GPU tests after their shared reporting moved into one helper, and the
# argmax fallback for rows too narrow for N pairs (a whole-lm_head path instead of an error).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python -m pytest -q -s tests/gpu/test_comm_gpu.py -k "vocab or bucket" > $OUT/test_comm_split.log 2>&1
grep -E "split ids|bit-equal|passed|failed|Left contains" $OUT/test_comm_split.log | tail -n 10
