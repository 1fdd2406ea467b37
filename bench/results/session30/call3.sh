# Session 30, call 3: GPU tests of the changed kernels (linear_f32's rows kernel and TF32x3 tiles, the shared expert
# in the several-row MoE launches); the slice step beside the tree before (ab_old/ = HEAD's kernels/ and models/),
# alternating, twice; kernel-alone profiles of the 8-row shard step and the rank of dp 8 (GLMSERVE_PDL=0).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 170 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "moe or linear_f32 or route" 2>&1 | tail -4 \
    | tee $OUT/tests.txt
for round in 1 2; do
    for tree in new old; do
        P=.; [ $tree = old ] && P=ab_old
        echo "== $tree, round $round"
        timeout -s KILL 100 env PYTHONPATH=$P:. python $P/bench/decode_slice.py --out $OUT/$tree$round --no-hf \
            --modes auto_graph 2>&1 | grep "^| "
    done
done 2>&1 | tee $OUT/slice_ab.txt
for a in "--rows 8 --shard" "--rows 1 --shard --dp"; do
    echo "== $a"
    GLMSERVE_PDL=0 timeout -s KILL 60 python bench/profile_slice.py $a 2>&1 | grep -v -i warn | head -14
done 2>&1 | tee $OUT/profile.txt
