# session 14, call 11 (the last ~5 min of device time): verify read back once — the drawn captured-drafting GPU test
# and the speculative engine tests, then the drawn and greedy MTP k = 3 rounds (compare with call 9: 6.217 / 5.303 ms)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 100 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "drawn or speculative or lookahead" 2>&1 | tail -2 | tee $OUT/gpu_tests.txt
for a in "--spec 3 --temperature 0.8 --tokens 48" "--spec 3 --tokens 48"; do
  timeout 75 python bench/step_host.py --top 12 $a 2>&1 | grep -v Warn > $OUT/step_host_${a// /_}.txt
  echo "== $a"; grep "decode step" $OUT/step_host_${a// /_}.txt
done
