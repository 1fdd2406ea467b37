# session 13, call 12: look-ahead decode steps on the GPU — the graph engine tests, then the step A/B
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 150 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "engine or speculative" 2>&1 | tail -3 | tee $OUT/gpu_graph_tests.txt
for a in "--no-lookahead" ""; do
  GLMSERVE_PDL=0 timeout 80 python bench/step_host.py --top 12 $a 2>&1 | grep -v Warn | tee $OUT/step_host_pdl0$a.txt | sed -n 3,9p
done
timeout 80 python bench/step_host.py --top 12 2>&1 | grep -v Warn | tee $OUT/step_host_pdl1.txt | sed -n 3,9p
