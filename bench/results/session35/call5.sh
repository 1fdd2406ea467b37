# Session 35, call 5: call 4's distributed run was cut at 300 s inside the span-vs-dp test (10 passed before it; the
# whole file took 227 s in session 33): the span-vs-dp tests alone.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 230 python -m pytest -v -rs tests/gpu/test_distributed_gpu.py -k "span_matches_dp" --durations=5 \
  > $OUT/test_span.log 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|s call" $OUT/test_span.log | tail -8
