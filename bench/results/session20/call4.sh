# session 20, call 4 (one H200): call 3's graph-test failure in full; the routing kernel's blocks at 64-256 rows;
# the step A/B of one K block a step for runs of >= 8 pairs (call 3's sweep favoured it at 256 rows).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 150 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_graphs_gpu.py -k "test_engine_with_graphs_equals_without and 40" 2>&1 | grep -E "^E |Error|passed|failed|assert" | head -n 30
timeout 120 python bench/results/session20/route_blocks.py 2>&1 | grep -v -i warn | tail -n 4
timeout 200 python bench/results/session20/moe_chunks.py --policies current sub1_8 sub1_16 --dp-rows 16 32 --full-rows 2>&1 | grep -v -i warn | tail -n 4
