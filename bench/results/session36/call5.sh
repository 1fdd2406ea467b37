# Session 36, call 5 (on call 4's machine): the distributed GPU tests with the new picks (dp buckets of 8 ranks run
# their MLPs at 64..256 rows).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 430 python -m pytest -v -rs tests/gpu/test_distributed_gpu.py > $OUT/test_distributed.log 2>&1
grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/test_distributed.log | cut -c1-150 | tail -20
