# session 14, call 10: the GPU tier on the session's last code (whole tests/gpu, full log)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 420 python -m pytest -q -rs tests/gpu 2>&1 | grep -v "Warn\|warn" > $OUT/gpu_tests.log
tail -15 $OUT/gpu_tests.log
