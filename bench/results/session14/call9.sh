# session 14, call 9: drawn speculation — drafts picked between captured drafting graphs vs the eager drafter (as
# drawn requests had it), one request after 4096 tokens, MTP k = 3, T 0.8 (random weights accept ~nothing: the round
# time is what is compared); greedy k = 3 beside; then bench/sampler.py (min-p without the sort)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
T="--spec 3 --temperature 0.8 --tokens 48"
i=0
for a in "$T" "$T --eager-drafts" "--spec 3 --tokens 48"; do
  i=$((i+1))
  timeout 110 python bench/step_host.py --top 12 $a 2>&1 | grep -v Warn > $OUT/step_host_$i.txt
  echo "== $i: $a"; grep "decode step\|Error\|error" $OUT/step_host_$i.txt | head -5
done
timeout 60 python bench/sampler.py --out $OUT 2>&1 | grep -v Warn | tee $OUT/sampler.txt | grep "rows,"
