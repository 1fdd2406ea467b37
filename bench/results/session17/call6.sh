# session 17, call 6 (one H200): the new 8-rank graph test at HEAD
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 500 python -m pytest -q -x tests/gpu/test_distributed_gpu.py -k "eight_ranks" --durations=3
# -> 1 passed (24.6 s)
