# Session 30, call 4: the final tree (the shared expert fused to 8 rows only) — every kernel GPU test, the graph
# tests, the distributed GPU tests; the slice step beside the tree before (ab_old/).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
for t in test_kernels_gpu test_graphs_gpu test_distributed_gpu; do
    timeout -s KILL 170 python -m pytest -q --tb=short tests/gpu/$t.py 2>&1 | tail -8 > $OUT/$t.log
    echo "$t: $(tail -1 $OUT/$t.log)"
done
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    echo "== $tree"
    timeout -s KILL 100 env PYTHONPATH=$P:. python $P/bench/decode_slice.py --out $OUT/$tree --no-hf \
        --modes auto_graph 2>&1 | grep "^| "
done 2>&1 | tee $OUT/slice_ab.txt
