#!/bin/bash
# Session 31, call 3: the final tree (sparse attention past 8 rows on 64 heads a program) — graph tests, MLA kernel
# tests; the slice step beside the tree before (ab_old/ = af589da's kernels/ and models/), once each.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 90 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "mla" 2>&1 | tail -2 > $OUT/test_mla.log
timeout -s KILL 170 python -m pytest -q tests/gpu/test_graphs_gpu.py 2>&1 | tail -3 > $OUT/test_graphs.log
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 110 env PYTHONPATH=$P:. python $P/bench/decode_slice.py --out $OUT/$tree --no-hf \
        --modes auto_graph 2>&1 | grep "^| "
done 2>&1 | tee $OUT/slice_ab.txt
cat $OUT/test_*.log
