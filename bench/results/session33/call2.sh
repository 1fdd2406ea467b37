# Session 33, call 2: the shared expert fused to 64 MoE rows (SHARED_PAIR_ROWS 8 → 64) and linear_f32's tile kernel
# to 256 rows (the router's logits under a dp step's 128 / 256 MoE rows, which ran on cuBLAS fp32): kernel tests,
# the router launch against torch, the rank of dp 8 A/B (ab_old = HEAD's kernels/models), then a profile.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "linear_f32 or shared_expert" > $OUT/test_kernels.log 2>&1
tail -3 $OUT/test_kernels.log
timeout -s KILL 90 python bench/tune_small_gemv.py --out $OUT --rows 16 64 128 256 2>&1 | grep '^|' > $OUT/router_rows.txt
cat $OUT/router_rows.txt
for i in 1 2; do
  timeout -s KILL 70 python bench/decode_slice.py --out $OUT/new$i --no-hf --modes auto_graph --slices dp 2>&1 | grep "^| rank"
  echo "-- old $i"
  timeout -s KILL 70 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old$i --no-hf --modes auto_graph \
    --slices dp 2>&1 | grep "^| rank"
done
GLMSERVE_PDL=0 timeout -s KILL 80 python bench/profile_slice.py --shard --dp --rows 8 32 > $OUT/profile_dp.txt 2>&1
grep -A8 '^== rows' $OUT/profile_dp.txt
