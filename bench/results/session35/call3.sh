# Session 35, call 3: the groups' GPU test with the group rule (from 512 outputs: a dp rank's shared expert), then the
# steps new / old alternating twice — a rank of dp 8 at 1..32 rows a rank, the tp shard, the full slice at 4k and 32k
# (old = HEAD at session start in ab_old/: the sparse attention's splits, the grouped projections past 8 rows).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 60 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "linear_group or gluon_mid" > $OUT/test_group.log 2>&1
tail -n 1 $OUT/test_group.log
for i in 1 2; do
  echo "-- new $i"
  timeout -s KILL 120 python bench/decode_slice.py --out $OUT/new$i --no-hf --modes auto_graph --slices full dp shard \
    2>&1 | grep -E "^\| (rank|shard|full)" | cut -d"|" -f2-4,10-11
  echo "-- old $i"
  timeout -s KILL 120 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old$i --no-hf --modes auto_graph \
    --slices full dp shard 2>&1 | grep -E "^\| (rank|shard|full)" | cut -d"|" -f2-4,10-11
done
rm -f $OUT/*/decode_slice.png $OUT/*/*.json
