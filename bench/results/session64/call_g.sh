#!/bin/bash
# Session 64, call g: as call e with the histograms by 12 + 12 + 8 bits of the key (call e: 16 + 16 with a coarse
# histogram by atomics, ~50 µs; call f: the coarse sums in the one-program scan, ~75 µs).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/device.txt
( time timeout 200 python -m pytest -q -rs tests/gpu/test_kernels_gpu.py -k "top_p_race or value_id_keys" ) \
    > $OUT/kernel_tests.log 2>&1; echo "kernel tests: $(grep -E 'passed|failed|error' $OUT/kernel_tests.log | tail -1)"
grep -E "^E " $OUT/kernel_tests.log | head -8
timeout 150 python bench/results/session64/sampler_ab.py > $OUT/sampler_ab.txt 2>&1; grep -E "top-p.*auto|same" $OUT/sampler_ab.txt
timeout 100 python bench/sampler.py --kernels auto --out $OUT/sampler_auto > $OUT/sampler_auto.txt 2>&1
grep -E "rows,|_kernel" $OUT/sampler_auto.txt | grep -B1 -A6 "top-p 0.95 (GLM" | cut -c1-120
for a in "" "--temperature 1.0 --top-p 0.95"; do n=sh$(echo $a | tr -d ' .-'); timeout 200 python bench/step_host.py --ctx 4096 \
    --tokens 64 $a --out $OUT/$n > $OUT/$n.txt 2>&1; grep -E "^decode step" $OUT/$n.txt; done
