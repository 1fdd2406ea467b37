# session 19, call 4 (one H200): tests/gpu/test_graphs_gpu.py whole — call 1's -k filter applied to it too, so its
# new cases (replays of the 32- and 64-row buckets, 40 requests with graphs vs without) had not run.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 400 python -m pytest -q -p no:cacheprovider tests/gpu/test_graphs_gpu.py 2>&1 | tail -n 4
