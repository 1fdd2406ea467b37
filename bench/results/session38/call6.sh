# Session 38, call 6: the step's start in one launch (ops.embed_rope: the embeddings and the rope angles, were six
# torch launches outside the PDL chain) — its GPU test, the graph tests, then the steps new / old alternating twice
# (old = HEAD's models/ in ab_old/).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 100 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "embed_rope" > $OUT/test_embed_rope.log 2>&1; tail -n 1 $OUT/test_embed_rope.log
timeout -s KILL 170 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1; tail -n 1 $OUT/test_graphs.log
for i in 1 2; do
  echo "-- new $i"
  timeout -s KILL 90 python bench/decode_slice.py --out $OUT/new$i --no-hf --modes auto_graph --slices full dp \
    2>&1 | grep -E "^\| (rank|full)" | cut -d"|" -f2-4,10-11
  echo "-- old $i"
  timeout -s KILL 90 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old$i --no-hf --modes auto_graph \
    --slices full dp 2>&1 | grep -E "^\| (rank|full)" | cut -d"|" -f2-4,10-11
done
rm -f $OUT/*/decode_slice.png $OUT/*/*.json
