#!/bin/bash
# Session 64, call e: the sort-free top-p (glmkernels/triton_sample.py): its GPU tests, the sampler A/B (session 63's
# code, this session's on the reference ops and on the Triton ops), bench/sampler.py both ways, and the engine's decode
# step greedy and drawn (T 1, top-p 0.95) on the slice.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
( time timeout 200 python -m pytest -q -rs tests/gpu/test_kernels_gpu.py -k "top_p_race or value_id_keys" ) \
    > $OUT/kernel_tests.log 2>&1; echo "kernel tests: $(grep -E 'passed|failed|error' $OUT/kernel_tests.log | tail -1)"
grep -E "^E " $OUT/kernel_tests.log | head -8
timeout 150 python bench/results/session64/sampler_ab.py > $OUT/sampler_ab.txt 2>&1; grep -E "rows,|same" $OUT/sampler_ab.txt
for k in auto reference; do timeout 100 python bench/sampler.py --kernels $k --out $OUT/sampler_$k > $OUT/sampler_$k.txt 2>&1; done
grep -E "rows," $OUT/sampler_auto.txt
for a in "" "--temperature 1.0 --top-p 0.95"; do n=sh$(echo $a | tr -d ' .-'); timeout 200 python bench/step_host.py --ctx 4096 \
    --tokens 64 $a --out $OUT/$n > $OUT/$n.txt 2>&1; grep -E "^decode step" $OUT/$n.txt; done
