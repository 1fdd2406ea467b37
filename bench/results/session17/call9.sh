# session 17, call 9 (one H200): decode graphs of 16 rows a rank (GRAPH_BUCKETS gains 16; a dp step's MoE stays
# within 64 rows) — the graph GPU tests (replay == eager for every bucket incl. 16 and verify16; engine with graphs
# == without at 12 requests); a batch of 12 / 16 requests decoding on the slice, graphs capped at 8 rows (9–16-row
# steps eager, as before) vs 16, alternating in one engine.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "replay or engine_with_graphs" -p no:cacheprovider 2>&1 | tail -n 3
timeout 180 python bench/batch_decode.py --requests 12 16 --ctx 4096 2>&1 | grep "^{"
