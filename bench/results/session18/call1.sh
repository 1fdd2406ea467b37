# session 18, call 1 (one H200): the Gluon expert kernels past 8 rows (runs in chunks of 16 pairs, 2..64 rows):
# the MoE GPU tests, then bench/rows_gemm.py --moe at 2..64 rows (Triton tile vs Gluon default vs a sweep).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
mkdir -p $OUT/moe
timeout 240 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "moe or route" 2>&1 | tail -n 15 | tee $OUT/tests.txt
timeout 330 python bench/rows_gemm.py --moe --moe-rows 8 16 32 64 --out $OUT/moe 2>&1 | grep -v Warning | tail -n 30
