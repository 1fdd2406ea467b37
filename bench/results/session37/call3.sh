# Session 37, call 3: after the ipc halves moved to the 4-byte stride (a bf16 phase then an fp32 one overlapped:
# call 2's captured split argmax read clobbered rows) — every comm GPU test, the distributed GPU tests, the
# single-process speculative graph tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python -m pytest -q -s tests/gpu/test_comm_gpu.py > $OUT/test_comm.log 2>&1
grep -E "split ids|passed|failed" $OUT/test_comm.log | tail -n 6
timeout -s KILL 300 python -m pytest -q -s tests/gpu/test_distributed_gpu.py > $OUT/test_dist.log 2>&1
grep -E "captured drafting|passed|failed" $OUT/test_dist.log | tail -n 4
timeout -s KILL 90 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "speculative or drawn" > $OUT/test_graphs_spec.log 2>&1
tail -n 2 $OUT/test_graphs_spec.log
