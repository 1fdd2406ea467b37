# session 15, call 2 (one H200): the graph tests (warm-up, drawn drafts over a widening selection), then a replica's
# cold start with and without the start-up warm-up (each in a fresh process with an empty Triton cache)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
mkdir -p $OUT/r
timeout 180 python -m pytest -q -rs tests/gpu/test_graphs_gpu.py 2>&1 | grep -v "Warn\|warn" > $OUT/r/gpu_graph_tests.log
tail -n 4 $OUT/r/gpu_graph_tests.log
for run in "4096 4 150" "0 4 150" "4096 2 90"; do
  set -- $run
  TRITON_CACHE_DIR=$(mktemp -d) timeout $3 python bench/warmup.py --warmup-tokens $1 --depth $2 --spec 3 \
    --out $OUT/r/warmup.jsonl > $OUT/r/warmup_w$1_d$2.txt 2>&1
  grep -v "^{" $OUT/r/warmup_w$1_d$2.txt | grep -v Warn | tail -n 9 | cut -c1-250
done
tar czf $OUT/call2.tgz -C $OUT r
