# session 20, call 3 (one H200): call 2's failure was ours (a loop's mask named like the new chunk flag); after the
# rename: the Gluon / fused MoE tests, the graph tests, a launch sweep at 128 / 256 rows with the kernels apart, and
# the rank of dp 8 at 32 rows a rank profiled without PDL.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
T=tests/gpu/test_kernels_gpu.py
timeout 120 python -m pytest -q -p no:cacheprovider $T -k "test_gluon_moe or test_moe_fp8 or route" 2>&1 | grep -E "FAILED|passed|failed" | tail -n 8
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_graphs_gpu.py 2>&1 | grep -E "FAILED|passed|failed" | tail -n 8
timeout 150 python bench/results/session20/moe_wide_sweep.py 2>&1 | grep -v -i warn | tail -n 8
GLMSERVE_PDL=0 timeout 100 python bench/profile_slice.py --shard --dp --rows 32 2>&1 | grep -v -i warn | head -n 24
