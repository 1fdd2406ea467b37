# session 14, call 8: the sampler without full-vocabulary softmax / cumsum launches (weights up to a factor, a
# two-level cumsum, top-k selected when every row has one ≤ 4096) — bench/sampler.py again, then the engine step
# of a drawn request (T 0.7, top-p 0.95) with look-ahead and the greedy one beside it
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python bench/sampler.py --out $OUT 2>&1 | grep -v Warn | tee $OUT/sampler.txt | grep "rows,"
T="--temperature 0.7 --top-p 0.95"
i=0
for a in "$T" "" "$T --no-lookahead"; do
  i=$((i+1))
  GLMSERVE_PDL=0 timeout 85 python bench/step_host.py --top 12 $a 2>&1 | grep -v Warn > $OUT/step_host_$i.txt
  echo "== $i: $a"; grep "decode step" $OUT/step_host_$i.txt
done
