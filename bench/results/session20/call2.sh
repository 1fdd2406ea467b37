# session 20, call 2 (one H200): is call 1's test failure (test_gluon_moe[tile2-3-16-256]) HEAD's too? Then the
# new moe_tile (compact grid from runs of 4 pairs, 16 pairs a program from 8): tests, sweep at 128 / 256 rows, step A/B.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
T=tests/gpu/test_kernels_gpu.py
echo "== new code, tile2 cases"; timeout 60 python -m pytest -q -p no:cacheprovider $T -k "test_gluon_moe and tile2" 2>&1 | grep -E "^E |passed|failed" | head -n 12
echo "== all gluon moe + bitwise"; timeout 150 python -m pytest -q -p no:cacheprovider $T -k "test_gluon_moe or test_moe_fp8_bitwise" 2>&1 | grep -E "FAILED|passed|failed" | tail -n 12
cp kernels/gluon_rows.py /tmp/new_gluon_rows.py
cp bench/results/session20/gluon_rows_head.py kernels/gluon_rows.py   # kernels/gluon_rows.py at 18ba5eb (removed after the call)
echo "== HEAD code, tile2 cases"; timeout 60 python -m pytest -q -p no:cacheprovider $T -k "test_gluon_moe and tile2" 2>&1 | grep -E "^E |passed|failed" | head -n 12
cp /tmp/new_gluon_rows.py kernels/gluon_rows.py
timeout 150 python bench/rows_gemm.py --moe --moe-rows 128 256 --out $OUT 2>&1 | grep -v -i warn | tail -n 6
timeout 150 python bench/results/session20/moe_chunks.py 2>&1 | grep -v -i warn | tail -n 8
