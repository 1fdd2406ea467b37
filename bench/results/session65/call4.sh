#!/bin/bash
# Session 65, call 4 (any card): call 3's drawn MTP runs again, with the slowest steps and the Triton kernels compiled
# after the warm-up listed (call 3's Triton-sampler run had one step of ~1.25 s: mean 28.2 ms, median 6.99).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
for a in "--spec 3 --temperature 1.0 --top-p 0.95" "--spec 3 --temperature 1.0 --top-p 0.95 --reference-sampler" \
         "--spec 3"; do
    n=sh$(echo $a | tr -d ' .-'); timeout 110 python bench/step_host.py --ctx 4096 --tokens 64 $a --out $OUT/$n \
    > $OUT/$n.txt 2>&1; echo "$a: $(grep -E '^decode step|^timed decode' $OUT/$n.txt | cut -c1-400)"; done
