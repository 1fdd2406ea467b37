#!/bin/bash
# Session 32, call 1: several-row q_a + kv_a + wk in one Gluon rows launch (``linear_group`` at 2..8 rows).
# Kernel tests; the slice step and its kernels beside the tree before (ab_old/ = HEAD's kernels/ and models/).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "linear_group or fp8_linear or rows" 2>&1 \
    | tail -4 > $OUT/test_kernels.log
cat $OUT/test_kernels.log
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 110 env PYTHONPATH=$P:. python $P/bench/decode_slice.py --out $OUT/$tree --no-hf \
        --modes auto_graph 2>&1 | grep "^| "
done 2>&1 | tee $OUT/slice_ab.txt
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 80 env PYTHONPATH=$P:. python $P/bench/profile_slice.py --rows 2 4 8 2>&1 | grep -v Warn
done > $OUT/profile_ab.txt 2>&1
timeout -s KILL 60 python bench/profile_slice.py --rows 8 --sequence > $OUT/profile_rows8_seq.txt 2>&1
timeout -s KILL 150 python -m pytest -q tests/gpu/test_graphs_gpu.py 2>&1 | tail -3 > $OUT/test_graphs.log
cat $OUT/test_graphs.log
grep -h "^== \|kernel time" $OUT/profile_ab.txt
