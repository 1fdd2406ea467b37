# Session 34, call 5: narrow experts at ≤ 8 rows one K block a step (call 4: 10-15 % faster a call) and past 8 rows
# the down programs' 4 output blocks: the rank of dp 8 and the shard, new / old alternating twice; the MoE tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
for i in 1 2; do
  timeout -s KILL 80 python bench/decode_slice.py --out $OUT/new$i --no-hf --modes auto_graph --slices dp shard 2>&1 \
    | grep -E "^\| (rank|shard)"
  echo "-- old $i"
  timeout -s KILL 80 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old$i --no-hf --modes auto_graph \
    --slices dp shard 2>&1 | grep -E "^\| (rank|shard)"
done
timeout -s KILL 100 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "gluon_moe or moe_fp8" > $OUT/test_moe.log 2>&1
tail -2 $OUT/test_moe.log
