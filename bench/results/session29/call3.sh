# Session 29, call 3: the slice step (full width and the shard-shaped case) with call 2's launches, beside the tree
# before (ab_old/), alternating, twice.
export NCCL_NVLS_ENABLE=0
for round in 1 2; do
    for tree in new old; do
        P=.; [ $tree = old ] && P=ab_old
        echo "== $tree, round $round"
        timeout -s KILL 130 env PYTHONPATH=$P:. python $P/bench/decode_slice.py --out $OUT/$tree$round --no-hf \
            --modes auto_graph 2>&1 | grep "^| "
    done
done 2>&1 | tee $OUT/slice_ab.txt
