# Session 29, call 4: kernel-alone times (GLMSERVE_PDL=0) of the one-row step, full width and the shard-shaped case,
# this tree beside the tree before (ab_old/).
export NCCL_NVLS_ENABLE=0 GLMSERVE_PDL=0
for tree in new old; do
    P=.; [ $tree = old ] && P=ab_old
    for s in "" "--shard"; do
        echo "== $tree $s"
        timeout -s KILL 120 env PYTHONPATH=$P:. python $P/bench/profile_slice.py --rows 1 $s 2>&1 | grep -v Warn | head -40
    done
done 2>&1 | tee $OUT/profile_ab.txt
