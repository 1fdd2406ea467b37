# Session 27, call 2: the one-row launch fusions — the indexer's wk in the q_a / kv_a GEMV launch (linear_group),
# q's rope in the absorb launch (mla_absorb_rope): the kernel tests, then the step A/B against the session's
# starting kernels/ + models/ (ab_old/, a copy of HEAD's), and the new step's launch order.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 200 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py 2>&1 | tail -8 | tee $OUT/gpu_tests_kernels.log
for i in 1 2; do
  timeout -s KILL 100 python bench/decode_slice.py --out $OUT/new$i --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
  timeout -s KILL 100 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old$i --no-hf --modes auto_graph \
      --no-shard 2>&1 | grep "^| full"
done
timeout -s KILL 90 env GLMSERVE_PDL=0 python bench/profile_slice.py --rows 1 8 --sequence > $OUT/profile.txt 2>&1
grep -A3 "^== rows" $OUT/profile.txt
