# session 15, call 5 (one H200): the whole GPU tier on the session's code (55b8594)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 440 python -m pytest -q -rs tests/gpu 2>&1 | grep -v "Warn\|warn" > $OUT/gpu_tests.log
tail -n 12 $OUT/gpu_tests.log
