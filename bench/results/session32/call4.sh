#!/bin/bash
# Session 32, call 4: wide experts at 2 rows split H in 4 (``gluon_rows.moe_tile``, from call 3's sweep). MoE and
# grouped-linear kernel tests, graph tests; the slice's kernels at 2 / 4 rows (twice each) beside call 2's tree (ab_old/).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 150 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "moe or linear_group" 2>&1 \
    | tail -2 > $OUT/test_kernels.log
timeout -s KILL 160 python -m pytest -q tests/gpu/test_graphs_gpu.py 2>&1 | tail -3 > $OUT/test_graphs.log
cat $OUT/test_*.log
for tree in new old new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 70 env PYTHONPATH=$P:. GLMSERVE_PDL=0 python $P/bench/profile_slice.py --rows 2 4 2>&1 \
        | grep -v Warn
done > $OUT/profile_ab_pdl0.txt 2>&1
grep -h "^== \|kernel time\|_moe_" $OUT/profile_ab_pdl0.txt
