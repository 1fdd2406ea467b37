#!/bin/bash
# Session 32, call 2: q_b + the indexer's wq_b in one launch at 2..8 rows too (``Attention.prepare`` groups them;
# one row keeps two GEMVs). Kernel + graph tests; the slice beside call 1's tree (ab_old/: its kernels/, models/).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 100 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "linear_group or fp8_linear or rows" 2>&1 \
    | tail -2 > $OUT/test_kernels.log
timeout -s KILL 160 python -m pytest -q tests/gpu/test_graphs_gpu.py 2>&1 | tail -3 > $OUT/test_graphs.log
cat $OUT/test_*.log
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 80 env PYTHONPATH=$P:. GLMSERVE_PDL=0 python $P/bench/profile_slice.py --rows 1 2 4 8 2>&1 \
        | grep -v Warn
done > $OUT/profile_ab_pdl0.txt 2>&1
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 110 env PYTHONPATH=$P:. python $P/bench/decode_slice.py --out $OUT/$tree --no-hf \
        --modes auto_graph 2>&1 | grep "^| "
done 2>&1 | tee $OUT/slice_ab.txt
grep -h "^== \|kernel time" $OUT/profile_ab_pdl0.txt
