# Session 28, call 1: the one-row MoE without its routing and combine launches, the router's GEMV and selection in
# one launch, q_b and the indexer's wq_b in one launch — the kernel tests, the step A/B against the session's
# starting kernels/ + models/ + bench/ (ab_old/: 350012e's), twice alternating, then the one-row step's launches.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py 2>&1 | tail -30 > $OUT/gpu_tests_kernels.log
tail -3 $OUT/gpu_tests_kernels.log
for r in 1 2; do
  timeout -s KILL 70 python bench/decode_slice.py --out $OUT/new$r --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
  timeout -s KILL 70 env PYTHONPATH=ab_old:. python ab_old/bench/decode_slice.py --out $OUT/old$r --no-hf \
      --modes auto_graph --no-shard 2>&1 | grep "^| full"
done
timeout -s KILL 60 env GLMSERVE_PDL=0 python bench/profile_slice.py --rows 1 --sequence > $OUT/profile.txt 2>&1
grep -A2 "^== rows" $OUT/profile.txt
