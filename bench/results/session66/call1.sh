#!/bin/bash
# Session 66, call 1 (any card): the sampler's GPU tests with the new warm-up test (no Triton compile after
# ``sampler.warm_up``), then session 65's call 4 — the drawn MTP runs whose one ~1.25 s step was suspected to be a
# compile after the warm-up — on this tree (the warm-up now runs the sampler's kernel variants).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 200 python -m pytest -q -rs -x tests/gpu/test_sample_gpu.py ) > $OUT/test_sample_gpu.log 2>&1
echo "test_sample_gpu: $(grep -E 'passed|failed|error' $OUT/test_sample_gpu.log | tail -1)"; grep -E '^E ' $OUT/test_sample_gpu.log | head -8
for a in "--spec 3 --temperature 1.0 --top-p 0.95" "--spec 3 --temperature 1.0 --top-p 0.95 --reference-sampler" \
         "--spec 3"; do
    n=sh$(echo $a | tr -d ' .-'); timeout 110 python bench/step_host.py --ctx 4096 --tokens 64 $a --out $OUT/$n \
    > $OUT/$n.txt 2>&1; echo "$a: $(grep -E '^decode step|^timed decode' $OUT/$n.txt | cut -c1-400)"; done
