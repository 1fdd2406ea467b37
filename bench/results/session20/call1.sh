# session 20, call 1 (one H200): the Gluon expert kernels over the runs' chunks (compact grid, 8 / 16 pairs a
# program) — GPU tests, the MoE sweep past 8 rows, then the decode-step A/B.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 170 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "test_gluon_moe or test_moe_fp8_bitwise" 2>&1 | tail -n 5
timeout 200 python bench/rows_gemm.py --moe --moe-rows 16 64 256 --out $OUT 2>&1 | grep -v -i warn | tail -n 20
timeout 200 python bench/results/session20/moe_chunks.py 2>&1 | grep -v -i warn | tail -n 8
