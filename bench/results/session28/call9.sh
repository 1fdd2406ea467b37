# Session 28, calls 9-10 (short commands while the machine was warm): the slice step with call 8's one-row
# MoE launches (new1, new2) beside the tree before them (ab_old/: 10e49cd's kernels/, models/, bench/; old).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 80 python bench/decode_slice.py --out $OUT/new --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
timeout -s KILL 45 env PYTHONPATH=ab_old:. python ab_old/bench/decode_slice.py --out $OUT/old --no-hf \
    --modes auto_graph --no-shard 2>&1 | grep "^| full"
timeout -s KILL 40 python bench/decode_slice.py --out $OUT/new2 --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
