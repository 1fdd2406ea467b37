# Session 25, call 4: the mid-size tile kernel's GPU tests, then the engine A/B (mid_tile's swap off / on).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
rm -rf /tmp/ab && mkdir -p /tmp/ab && cp -r kernels /tmp/ab/
sed -i 's/    if N >= 1024 and (M > 128 or N > 4096):/    if False:/' /tmp/ab/kernels/triton_linear.py
grep -c "    if False:" /tmp/ab/kernels/triton_linear.py
timeout 120 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "fp8_linear" 2>&1 | tail -4 | tee $OUT/gpu_tests.log
A="--depth 16 --mlp-shard 8 --modes pieces --prompts 100 200 --repeats 3 --ctx 2048"
timeout 160 env PYTHONPATH=/tmp/ab:. python bench/mixed_steps.py $A > $OUT/call4_base.txt 2>&1
timeout 160 python bench/mixed_steps.py $A > $OUT/call4_new.txt 2>&1
grep -h '"case"' $OUT/call4_base.txt $OUT/call4_new.txt
timeout 100 python -m pytest -q tests/gpu/test_graphs_gpu.py -k "pieces" 2>&1 | tail -4 | tee -a $OUT/gpu_tests.log
