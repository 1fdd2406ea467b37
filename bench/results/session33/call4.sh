# Session 33, call 4: the distributed GPU tests on this tree (session 32's run was cut at 230 s): the 8-rank dp
# bucket of 8 a rank now runs its MoE (64 rows) with the shared expert fused.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 440 python -m pytest -v -rs tests/gpu/test_distributed_gpu.py > $OUT/test_distributed.log 2>&1
grep -E 'PASSED|FAILED|ERROR|SKIPPED|passed|failed' $OUT/test_distributed.log | tail -30
