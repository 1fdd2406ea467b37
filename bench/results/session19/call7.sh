# session 19, call 7 (one H200): the mid-size tile (65–256 rows) split over K — its GPU tests, then unsplit vs split
# linears and the rank-of-dp-8 step at 16 / 32 rows a rank, alternating (bench/results/session19/mid_tile.py).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 100 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k "fp8_linear" 2>&1 | tail -n 2
timeout 280 python bench/results/session19/mid_tile.py 2>&1 | grep -v -i warn
