# session 17, call 3 (one H200): the MoE of a graph step in 8 ranks (a dp step's MoE takes 8 × 8 = 64 rows) took the
# grouped launches, whose host sync a CUDA graph cannot hold — now the fused launches take up to 64 rows: their GPU
# tests (graph replay at 64 rows, fp32 rows), and fused vs grouped at 33–64 rows.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "moe" 2>&1 | tail -n 4
timeout 200 python bench/moe_prefill.py --fused --rows 33 48 64 2>&1 | grep "^I "
# the same graph test on HEAD's kernels (.old_rev: FUSED_MAX_ROWS 32): expected to fail at 64 rows
PYTHONPATH=.old_rev:. timeout 100 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "bitwise_and_graph and 64" 2>&1 | grep -i "error\|passed\|failed" | head -n 6
