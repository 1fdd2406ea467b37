# session 13, call 6: the whole GPU tier on the final code, then time to first token (bf16 / fp8 activations)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 380 python -m pytest -q -rs tests/gpu 2>&1 | tail -20 > $OUT/gpu_tests_session13.log
tail -5 $OUT/gpu_tests_session13.log
for a in bf16 fp8; do
  timeout 90 python bench/step_host.py --top 20 --prefill-activations $a 2>&1 | grep -v Warn | tee $OUT/step_host_$a.txt | sed -n 3,9p
done
