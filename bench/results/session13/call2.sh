# session 13, call 2: W8A8 GPU tests, prefill GEMM bench, fp8 TTFT on the slice
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
python -m pytest -q tests/gpu/test_kernels_gpu.py -k "w8a8 or act_quant or fp8_prefill" 2>&1 | tail -15 > $OUT/gpu_tests.txt
cat $OUT/gpu_tests.txt
timeout 240 python bench/prefill_w8a8.py --out $OUT 2>&1 | tee $OUT/prefill_w8a8.txt
timeout 120 python bench/step_host.py --top 20 --prefill-activations fp8 2>&1 | grep -v Warn | tee $OUT/step_host_fp8.txt | head -16
