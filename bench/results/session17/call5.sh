# session 17, call 5 (one H200): runs in chunks of 16 pairs from 17 rows on too (a graph step in 4 ranks × 8 is 32
# rows): fused launches at 16–64 rows (chunks / whole runs, 128- / 256-deep K steps) vs grouped; the MoE GPU tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "moe or route" 2>&1 | tail -n 2
timeout 300 python bench/moe_prefill.py --fused --rows 16 24 32 48 64 2>&1 | grep "^I "
