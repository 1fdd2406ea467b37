# session 18, call 3 (one H200): the Gluon expert kernels past 8 rows with runs in chunks of 8 (moe_tile's launch
# past 8 rows): GPU tests (MoE, graphs), bench/rows_gemm.py --moe at 2–64 rows, and the slice's graph step A/B —
# the session's start kernels (.old_rev: 55f8560) vs now, 'rank of dp 8' at 1 and 8 rows a rank (64 MoE rows).
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT/moe $OUT/old $OUT/new
PYTHONPATH=. timeout 200 python -m pytest -q tests/gpu/test_kernels_gpu.py tests/gpu/test_graphs_gpu.py -k "moe or route or graph or bucket or replay" 2>&1 | tail -n 6 | tee $OUT/tests.txt
PYTHONPATH=. timeout 120 python bench/rows_gemm.py --moe --out $OUT/moe 2>&1 | grep -v Warning | tail -n 14
for rev in old new; do
  pp=.; [ $rev = old ] && pp=.old_rev:.
  PYTHONPATH=$pp timeout 120 python bench/decode_slice.py --no-hf --modes auto_graph --out $OUT/$rev 2>&1 | grep -v Warning | tail -n 3
  grep -E '^\| (full|shard|rank)' $OUT/$rev/decode_slice.md | head -12
done
