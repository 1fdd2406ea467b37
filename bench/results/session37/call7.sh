# Session 37, call 7: the captured bucket_logits test against the slices computed on the rank (bit for bit) and the
# whole lm_head (bf16 rounding; call 6 found 1-ulp differences at V = 20000 over 2 / 4).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python -m pytest -q -s tests/gpu/test_comm_gpu.py -k "vocab or bucket" > $OUT/test_comm_split.log 2>&1
grep -E "split ids|bit-equal|passed|failed|Left contains" $OUT/test_comm_split.log | tail -n 10
