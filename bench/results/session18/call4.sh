# session 18, call 4 (one H200): a batch of 12 / 16 requests decoding on the slice (graphs of 16 rows: the 16-row
# MoE now on the Gluon kernels), the session's start kernels (.old_rev) vs now; the graph GPU tests at HEAD.
export NCCL_NVLS_ENABLE=0
for rev in old new; do
  pp=.; [ $rev = old ] && pp=.old_rev:.
  echo "== $rev"; PYTHONPATH=$pp timeout 170 python bench/batch_decode.py --requests 12 16 --ctx 4096 2>&1 | grep "^{"
done
PYTHONPATH=. timeout 150 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "gluon_moe" -p no:cacheprovider 2>&1 | tail -n 2
