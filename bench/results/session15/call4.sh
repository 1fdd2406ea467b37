# session 15, call 4 (one H200): the start-up warm-up with prompts in each kernel row class (a replica's first
# requests, fresh processes, empty Triton caches); the penalized step after fewer launches; the sampler at GLM's
# vocabulary with penalties; the fp8-prefill engine test (it now builds without a warm-up)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
mkdir -p $OUT/r
for run in "4096 3 110" "4096 0 100" "0 0 60"; do
  set -- $run
  TRITON_CACHE_DIR=$(mktemp -d) timeout $3 python bench/warmup.py --warmup-tokens $1 --spec $2 \
    --out $OUT/r/warmup.jsonl > $OUT/r/warmup_w$1_s$2.txt 2>&1
  echo "== warm-up $1 spec $2"; grep -v "^{" $OUT/r/warmup_w$1_s$2.txt | grep -v -i warn | tail -n 5 | cut -c1-200
done
W='import sys, functools, bench.step_host as h; from scheduler.request import SamplingParams as S
h.SamplingParams = functools.partial(S, presence_penalty=0.5, frequency_penalty=0.3); sys.argv[0] = "step_host"; h.main()'
T="--temperature 0.7 --top-p 0.95 --tokens 64 --top 12"
for run in "4096 pen" "32768 pen" "32768 plain"; do
  set -- $run
  if [ $2 = pen ]; then cmd=(python -c "$W"); else cmd=(python bench/step_host.py); fi
  GLMSERVE_PDL=0 timeout 88 "${cmd[@]}" --ctx $1 $T 2>&1 | grep -v Warn > $OUT/r/step_$1_$2.txt
  echo "== $run"; grep "decode step" $OUT/r/step_$1_$2.txt
done
timeout 60 python bench/sampler.py --out $OUT/r 2>&1 | grep -v Warn > $OUT/r/sampler.txt; grep "rows," $OUT/r/sampler.txt
timeout 60 python -m pytest -q tests/gpu/test_kernels_gpu.py -k fp8_prefill_activations 2>&1 | tail -n 1 | tee $OUT/r/gpu_fp8_engine.txt
tar czf $OUT/call4.tgz -C $OUT r
