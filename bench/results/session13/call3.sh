export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python bench/results/session13/probe.py 2>&1 | tee $OUT/probe.txt
timeout 300 python bench/prefill_w8a8.py --sweep 2>&1 | tee $OUT/sweep.txt
