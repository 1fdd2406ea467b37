# Session 34, call 3: the rank of dp 8 with narrow experts' down programs taking 4 output blocks past 8 rows, new /
# old (ab_old = HEAD's kernels / models / bench) alternating twice; the down sweep at ≤ 8 rows (I 256) and for an ep
# rank (I 2048, 32 held); the MoE kernel tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 100 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "gluon_moe or moe_fp8" > $OUT/test_moe.log 2>&1
tail -2 $OUT/test_moe.log
for i in 1 2; do
  timeout -s KILL 70 python bench/decode_slice.py --out $OUT/new$i --no-hf --modes auto_graph --slices dp 2>&1 | grep "^| rank"
  echo "-- old $i"
  timeout -s KILL 70 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old$i --no-hf --modes auto_graph \
    --slices dp 2>&1 | grep "^| rank"
done
timeout -s KILL 60 python bench/moe_few_rows.py --inter 256 --rows 2 4 8 --draws 3 --down --out $OUT 2>&1 | tail -3
timeout -s KILL 80 python bench/moe_few_rows.py --held 32 --rows 16 64 128 --draws 3 --down --out $OUT 2>&1 | tail -3
