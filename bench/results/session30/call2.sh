# Session 30, call 2: linear_f32 under a few rows — the new rows kernel beside the tile kernel (IEEE / TF32x3 dots);
# its GPU test; the shard-shaped 8-row step's kernels with it (GLMSERVE_PDL=0).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 300 python bench/tune_small_gemv.py --out $OUT --rows 2 4 8 16 32 64 2>&1 | grep -v -i warn | tee $OUT/rows_sweep.txt
timeout -s KILL 120 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "linear_f32" 2>&1 | tail -3
GLMSERVE_PDL=0 timeout -s KILL 120 python bench/profile_slice.py --rows 8 --shard 2>&1 | grep -v -i warn | head -12 | tee $OUT/profile.txt
