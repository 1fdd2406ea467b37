# Session 25, call 7: the prescaled tile kernel swept (bench/mid_gemm.py --sweep prescale), then mid_tile's swapped
# launch prescaled (a copy of kernels/ in /tmp/pre): the fp8_linear GPU tests on it, the engine A/B against HEAD's.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
rm -rf /tmp/pre && mkdir -p /tmp/pre && cp -r kernels /tmp/pre/
sed -i 's/num_stages=3, swap=True, block_m=128)/num_stages=3, swap=True, block_m=128, prescale=True)/' /tmp/pre/kernels/triton_linear.py
grep -c "block_m=128, prescale=True)" /tmp/pre/kernels/triton_linear.py
timeout 140 python bench/mid_gemm.py --sweep prescale --out $OUT --rows 128 256 32 --budget-s 115 \
    --shapes o_proj q_b q_a "dense down 1/8" "indexer wq_b" 2>&1 | grep -v Warn | grep -v "^|"
timeout 30 env PYTHONPATH=/tmp/pre:. python -m pytest -q tests/gpu/test_kernels_gpu.py -k "fp8_linear" 2>&1 | tail -3 \
    | tee $OUT/gpu_tests_prescale.log
A="--depth 16 --mlp-shard 8 --modes pieces --prompts 100 200 --repeats 3 --ctx 2048"
timeout 55 env PYTHONPATH=/tmp/pre:. python bench/mixed_steps.py $A > $OUT/call7_pre.txt 2>&1
timeout 45 python bench/mixed_steps.py $A > $OUT/call7_head.txt 2>&1
grep -h '"case"' $OUT/call7_pre.txt $OUT/call7_head.txt
