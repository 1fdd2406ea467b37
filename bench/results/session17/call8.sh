# session 17, call 8 (one H200): the whole GPU tier at the session's code (fused MoE to 64 rows in chunks, the
# 8-rank graph test, the front end fixes)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 560 python -m pytest -q -rs tests/gpu -p no:cacheprovider 2>&1 | grep -v "Warn\|warn" > $OUT/gpu_tests.log
tail -n 14 $OUT/gpu_tests.log
