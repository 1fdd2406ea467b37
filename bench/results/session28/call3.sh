# Session 28, call 3: what stays — the one-row MoE without its routing launch (its combine ranks the slots): the MoE
# and graph tests, the MoE alone and the slice step beside the session's start (ab_old/: 350012e's kernels/, models/,
# bench/); then session 27's mid_tile rule as the default: test_gluon_mid on the GPU and the mixed-step A/B against the
# same tree with 7593508's gluon_mid.py (the rule before it).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 60 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py -k "moe or router or gluon_mid" \
    2>&1 | tail -20 > $OUT/gpu_tests_kernels.log
tail -2 $OUT/gpu_tests_kernels.log
timeout -s KILL 110 python -m pytest -q --tb=short tests/gpu/test_graphs_gpu.py 2>&1 | tail -20 > $OUT/gpu_tests_graphs.log
tail -2 $OUT/gpu_tests_graphs.log
timeout -s KILL 45 python bench/moe_one_row.py --reps 3 > $OUT/moe_new.txt 2>&1
timeout -s KILL 45 env PYTHONPATH=ab_old:. python ab_old/bench/moe_one_row.py --reps 3 > $OUT/moe_old.txt 2>&1
tail -6 $OUT/moe_new.txt $OUT/moe_old.txt
timeout -s KILL 60 python bench/decode_slice.py --out $OUT/new --no-hf --modes auto_graph --no-shard 2>&1 | grep "^| full"
timeout -s KILL 60 env PYTHONPATH=ab_old:. python ab_old/bench/decode_slice.py --out $OUT/old --no-hf \
    --modes auto_graph --no-shard 2>&1 | grep "^| full"
rm -rf /tmp/mid && mkdir -p /tmp/mid && cp -r kernels /tmp/mid/ && git show 7593508:kernels/gluon_mid.py > /tmp/mid/kernels/gluon_mid.py
A="--depth 16 --modes pieces --prompts 100 200 --repeats 3 --ctx 2048"
timeout -s KILL 60 python bench/mixed_steps.py $A > $OUT/mixed_new.txt 2>&1
timeout -s KILL 60 env PYTHONPATH=/tmp/mid:. python bench/mixed_steps.py $A > $OUT/mixed_old.txt 2>&1
grep -h '"case"' $OUT/mixed_new.txt $OUT/mixed_old.txt | cut -c1-300
