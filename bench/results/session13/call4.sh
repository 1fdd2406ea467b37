# session 13, call 4: the W8A8 GPU tests after the fixes, the prefill bench (cuBLAS block-scaled GEMM), TTFT A/B
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
python -m pytest -q -rA tests/gpu/test_kernels_gpu.py -k "w8a8 or act_quant or fp8_prefill" 2>&1 | grep -v "^PASSED" | tail -25 > $OUT/gpu_tests.txt
cat $OUT/gpu_tests.txt
timeout 200 python bench/prefill_w8a8.py --out $OUT 2>&1 | tee $OUT/prefill_w8a8.txt
for a in fp8 bf16; do
  timeout 100 python bench/step_host.py --top 20 --prefill-activations $a 2>&1 | grep -v Warn | tee $OUT/step_host_$a.txt | head -14
done
