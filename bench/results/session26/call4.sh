# Session 26, call 4: the GPU kernel tests with the mid-size kernel as the default (16..256 rows), its launches at
# 16 rows, then the engine A/B against the same tree with the kernel off (a copy of kernels/ in /tmp/ab):
# mixed steps (16 decoders + a 100 / 200-token prompt, 16 layers, MLP / 8, pieces) and batch decode (32 / 64 rows).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
rm -rf /tmp/ab && mkdir -p /tmp/ab && cp -r kernels /tmp/ab/
sed -i 's/    return (HAVE_HOPPER and MIN_ROWS <= M/    return False and (HAVE_HOPPER and MIN_ROWS <= M/' /tmp/ab/kernels/gluon_mid.py
grep -c "return False and (HAVE_HOPPER" /tmp/ab/kernels/gluon_mid.py
timeout -s KILL 200 python -m pytest -q --tb=short tests/gpu/test_kernels_gpu.py 2>&1 | tail -8 | tee $OUT/gpu_tests_kernels.log
timeout -s KILL 60 python bench/mid_gemm.py --out $OUT/mid16 --sweep hopper --rows 16 \
    --shapes o_proj q_b "dense down" "dense gate_up" --budget-s 50 2>&1 | grep -v "^|"
A="--depth 16 --mlp-shard 8 --modes pieces --prompts 100 200 --repeats 3 --ctx 2048"
timeout -s KILL 60 python bench/mixed_steps.py $A > $OUT/mixed_new.txt 2>&1
timeout -s KILL 60 env PYTHONPATH=/tmp/ab:. python bench/mixed_steps.py $A > $OUT/mixed_old.txt 2>&1
grep -h '"case"' $OUT/mixed_new.txt $OUT/mixed_old.txt | cut -c1-400
B="--requests 32 64 --caps 64 --tokens 32 --ctx 2048"
timeout -s KILL 75 python bench/batch_decode.py $B > $OUT/batch_new.txt 2>&1
timeout -s KILL 75 env PYTHONPATH=/tmp/ab:. python bench/batch_decode.py $B > $OUT/batch_old.txt 2>&1
tail -4 $OUT/batch_new.txt $OUT/batch_old.txt
