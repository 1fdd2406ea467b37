# session 15, call 3 (one H200): penalties on the device — the graph tests (a penalized row launched ahead), the group
# engine gate, and a penalized request's decode step at 4k / 32k context against the session's start (.old_rev =
# git archive 8684acd, carried); the same request without penalties as the reference
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT/r
PYTHONPATH=. timeout 120 python -m pytest -q -rs tests/gpu/test_graphs_gpu.py 2>&1 | grep -v "Warn\|warn" > $OUT/r/gpu_graph_tests.log
tail -n 2 $OUT/r/gpu_graph_tests.log
W='import sys, functools, bench.step_host as h; from scheduler.request import SamplingParams as S
h.SamplingParams = functools.partial(S, presence_penalty=0.5, frequency_penalty=0.3); sys.argv[0] = "step_host"; h.main()'
T="--temperature 0.7 --top-p 0.95 --tokens 64 --top 12"
for run in "new 4096 pen" "old 4096 pen" "new 4096 plain" "new 32768 pen" "old 32768 pen"; do
  set -- $run
  dir=.; [ $1 = old ] && dir=.old_rev
  if [ $3 = pen ]; then cmd=(python -c "$W"); else cmd=(python bench/step_host.py); fi
  (cd $dir && GLMSERVE_PDL=0 PYTHONPATH=. timeout 88 "${cmd[@]}" --ctx $2 $T 2>&1 | grep -v Warn > $OUT/r/step_$1_$2_$3.txt)
  echo "== $run"; grep '^{' $OUT/r/step_$1_$2_$3.txt | cut -c1-420
done
PYTHONPATH=. timeout 100 python -m pytest -q tests/gpu/test_distributed_gpu.py -k "ipc and auto" 2>&1 | tail -n 2 | tee $OUT/r/gpu_distributed.txt
tar czf $OUT/call3.tgz -C $OUT r
