# Session 38, call 1: the GPU tests of session 37's last change (argmax_logits packs its pairs as bucket_logits packs
# words), then the Gluon rows / expert kernels under programmatic dependent launch (GLMSERVE_PDL=gluon) against the
# default (1), alternating twice: the full slice and a rank of dp 8.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 100 python -m pytest -q tests/gpu/test_comm_gpu.py -k "vocab or bucket" > $OUT/test_comm_split.log 2>&1
tail -n 1 $OUT/test_comm_split.log
timeout -s KILL 150 python -m pytest -q tests/gpu/test_distributed_gpu.py -k "speculative_group" > $OUT/test_dist_spec.log 2>&1
tail -n 1 $OUT/test_dist_spec.log
for i in 1 2; do
  for m in 1 gluon; do
    echo "-- PDL $m ($i)"
    timeout -s KILL 110 env GLMSERVE_PDL=$m python bench/decode_slice.py --out $OUT/pdl_${m}_$i --no-hf --modes auto_graph \
      --slices full dp 2>&1 | grep -E "^\| (rank|full)" | cut -d"|" -f2-4,10-11
  done
done
rm -f $OUT/*/decode_slice.png $OUT/*/*.json
