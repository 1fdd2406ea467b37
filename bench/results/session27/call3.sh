# Session 27, call 3: the three one-row launch fusions (the indexer's wk in the q_a / kv_a GEMV launch; q's rope in
# the absorb launch; the indexer's key rows in MLA's cache-row launch): the kernel tests, the step A/B against the
# session's starting kernels/ + models/ (ab_old/: HEAD's), the new step's launch order, then the graph tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 190 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py 2>&1 | tail -30 > $OUT/gpu_tests_kernels.log
tail -3 $OUT/gpu_tests_kernels.log
timeout -s KILL 80 python bench/decode_slice.py --out $OUT/new --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
timeout -s KILL 80 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old --no-hf --modes auto_graph \
    --no-shard 2>&1 | grep "^| full"
timeout -s KILL 60 env GLMSERVE_PDL=0 python bench/profile_slice.py --rows 1 --sequence > $OUT/profile.txt 2>&1
grep -A2 "^== rows" $OUT/profile.txt
timeout -s KILL 170 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -30 > $OUT/gpu_tests_graphs.log
tail -3 $OUT/gpu_tests_graphs.log
