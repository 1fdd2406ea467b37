# Session 36, call 3: the new split / tile rules (gluon_mid.mid_tile, gluon_rows.rows_tile) — the mid-size and rows
# kernels' GPU tests, then the steps new / old alternating twice (old = HEAD at session start in ab_old/): a rank of
# dp 8 at 1..32 rows a rank, the tp shard, the full slice at 4k and 32k.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "fp8_linear or gluon_rows or gluon_mid or linear_group" \
  > $OUT/test_kernels.log 2>&1
tail -n 2 $OUT/test_kernels.log
for i in 1 2; do
  echo "-- new $i"
  timeout -s KILL 105 python bench/decode_slice.py --out $OUT/new$i --no-hf --modes auto_graph --slices full dp shard \
    2>&1 | grep -E "^\| (rank|shard|full)" | cut -d"|" -f2-4,10-11
  echo "-- old $i"
  timeout -s KILL 105 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old$i --no-hf --modes auto_graph \
    --slices full dp shard 2>&1 | grep -E "^\| (rank|shard|full)" | cut -d"|" -f2-4,10-11
done
rm -f $OUT/*/decode_slice.png $OUT/*/*.json
