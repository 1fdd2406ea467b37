# Session 29, call 2: the GEMV's per-step option as the default from 8192 K (32 × 512, ~3 programs an SM) and the
# one-row MoE's per-step launches for narrow experts and the 8-pair launch — the kernel tests, then each launch
# beside the tree before (ab_old/: HEAD's kernels/ and models/ with this tree's bench/), then the graph tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 170 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "linear or moe or gemv or group or f32" \
    2>&1 | tail -20 > $OUT/gpu_tests_kernels.log
tail -2 $OUT/gpu_tests_kernels.log
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 60 env PYTHONPATH=$P:. python $P/bench/gemv_variants.py --explain \
        --shapes 6144x16384 6144x12288 2>&1 | grep -v Warn | cut -c1-90
    for args in "" "--width 256" "--no-shared"; do
        timeout -s KILL 40 env PYTHONPATH=$P:. python $P/bench/moe_one_row.py --each --picks $args 2>&1 | grep -v Warn
    done
done 2>&1 | tee $OUT/ab.txt
timeout -s KILL 170 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -20 > $OUT/gpu_tests_graphs.log
tail -2 $OUT/gpu_tests_graphs.log
