# session 14, call 1: drawn (temperature / top-p) rows sample on the device and look ahead — the step A/B in one
# process (greedy and drawn; look-ahead off; pageable sampling copies as before), then the graph engine tests
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
T="--temperature 0.7 --top-p 0.95"
i=0
for a in "" "--no-lookahead" "$T" "$T --no-lookahead" "$T --no-lookahead --pageable-copies"; do
  i=$((i+1))
  GLMSERVE_PDL=0 timeout 85 python bench/step_host.py --top 12 $a 2>&1 | grep -v Warn > $OUT/step_host_$i.txt
  echo "== $i: $a"; sed -n 3,12p $OUT/step_host_$i.txt | grep -v "^ " | cut -c1-400
done
timeout 85 python bench/step_host.py --top 12 $T 2>&1 | grep -v Warn > $OUT/step_host_pdl1_drawn.txt
echo "== pdl1 drawn"; grep "decode step" $OUT/step_host_pdl1_drawn.txt
timeout 120 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "engine or speculative or lookahead" 2>&1 | tail -4 | tee $OUT/gpu_graph_tests.txt
