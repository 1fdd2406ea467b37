# session 20, call 5 (one H200): the committed launches — the MoE over the runs' chunks (16 pairs, one K block a step
# from runs of 8), the routing kernel's many-pair launch — and look-ahead at batch (the schedulers' slack position,
# steps launched ahead used less the rows of requests that ended): tests, the step A/B against session 19's MoE
# launches, look-ahead on / off at 32 and 64 requests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 100 python -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k "test_gluon_moe or test_moe_fp8 or route" 2>&1 | grep -E "FAILED|passed|failed" | tail -n 8
timeout 130 python -m pytest -q -p no:cacheprovider tests/gpu/test_graphs_gpu.py 2>&1 | grep -E "^E  |FAILED|passed|failed" | tail -n 12
timeout 120 python bench/results/session20/moe_chunks.py --policies session19 current 2>&1 | grep -v -i warn | tail -n 6
timeout 175 python bench/batch_decode.py --lookahead-ab --requests 32 64 --tokens 48 2>&1 | grep "^{"
