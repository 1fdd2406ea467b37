# session 17, call 2 (one H200): the wide select reading no key past a row's position (and the scoring launch storing
# none there) — the paged indexer at exact / padded widths before (HEAD's kernels in .old_rev) and after; the kernels'
# GPU tests; a long prompt after a start-up warm-up that covers its context: does it compile anything?
export NCCL_NVLS_ENABLE=0
PYTHONPATH=.old_rev:. timeout 120 python bench/graph_width.py --indexer-only --out $OUT/old 2>&1 | grep "^|" | tail -n 8
PYTHONPATH=. timeout 120 python bench/graph_width.py --indexer-only --out $OUT/new 2>&1 | grep "^|" | tail -n 8
PYTHONPATH=. timeout 150 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "index or select or paged" 2>&1 | tail -n 2
mkdir -p $OUT/trace
PYTHONPATH=. timeout 250 python bench/long_prefill.py --ctx 65536 --tokens 8 --warmup-tokens 66560 --trace $OUT/trace 2>&1 | grep -v -i warn | tail -n 3
cd $OUT && tar czf trace.tgz trace && rm -rf trace
