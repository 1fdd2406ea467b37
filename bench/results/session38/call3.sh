# Session 38, call 3: the Gluon rows kernel alone under programmatic dependent launch (GLMSERVE_PDL=rows: its first
# step's weight lines prefetched into L2 before the wait) against the default (1), alternating twice.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
for i in 1 2; do
  for m in 1 rows; do
    echo "-- PDL $m ($i)"
    timeout -s KILL 110 env GLMSERVE_PDL=$m python bench/decode_slice.py --out $OUT/pdl_${m}_$i --no-hf --modes auto_graph \
      --slices full dp 2>&1 | grep -E "^\| (rank|full)" | cut -d"|" -f2-4,10-11
  done
done
rm -f $OUT/*/decode_slice.png $OUT/*/*.json
