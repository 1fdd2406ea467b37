# session 13, call 1: W8A8 GPU tests, prefill GEMM bench, engine step A/B (sampling's row pick) and fp8 TTFT
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
python -m pytest -q tests/gpu/test_kernels_gpu.py -k "w8a8 or act_quant or fp8_prefill" 2>&1 | tail -15 > $OUT/gpu_tests.txt
cat $OUT/gpu_tests.txt
timeout 200 python bench/prefill_w8a8.py --out $OUT 2>&1 | tee $OUT/prefill_w8a8.txt
for a in "--list-index" "" ; do
  GLMSERVE_PDL=0 timeout 100 python bench/step_host.py --top 16 $a 2>&1 | grep -v Warn | tee $OUT/step_host_pdl0$a.txt | head -22
done
timeout 100 python bench/step_host.py --top 20 --prefill-activations fp8 2>&1 | tee $OUT/step_host_fp8.txt | head -16
