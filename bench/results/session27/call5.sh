# Session 27, call 5: q_a's RMSNorm joins the cache-row launch (three row sets): the kernel tests that touch it, the
# graph tests, then the step against the session's starting kernels/ + models/ (ab_old/: 0a699a7's).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 60 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "norm or rope or absorb or group or tiny" \
    2>&1 | tail -20 > $OUT/gpu_tests_kernels.log
tail -2 $OUT/gpu_tests_kernels.log
timeout -s KILL 110 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -20 > $OUT/gpu_tests_graphs.log
tail -2 $OUT/gpu_tests_graphs.log
timeout -s KILL 50 python bench/decode_slice.py --out $OUT/new --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
timeout -s KILL 50 env PYTHONPATH=ab_old:. python bench/decode_slice.py --out $OUT/old --no-hf --modes auto_graph \
    --no-shard 2>&1 | grep "^| full"
