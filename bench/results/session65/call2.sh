#!/bin/bash
# Session 65, call 2 (any card): the top-k without a topk (ops.top_k_race, a radix select by count before top-p's by
# mass) and the penalties in one launch (ops.penalize): their GPU tests with the sampler's other kernels', the sampler's
# cost per setting with the Triton ops and with the reference (the path before: keys, topk, ~25 elementwise launches;
# the penalties' ~12) in the same run, and the engine's decode step drawn with a top-k and top-p beside greedy and GLM's
# top-p alone (bench/step_host.py).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 200 python -m pytest -q -rs tests/gpu/test_sample_gpu.py ) > $OUT/sample_tests.log 2>&1
echo "sample tests: $(grep -E 'passed|failed|error' $OUT/sample_tests.log | tail -1)"; grep -E "^E " $OUT/sample_tests.log | head -8
for k in auto reference; do timeout 120 python bench/sampler.py --kernels $k --out $OUT/sampler_$k > $OUT/sampler_$k.txt 2>&1
    echo "== $k"; grep -E "rows," $OUT/sampler_$k.txt; done
grep -A6 "1 rows, T 0.6, top-k 20" $OUT/sampler_auto.txt | cut -c1-120
for a in "" "--temperature 1.0 --top-p 0.95" "--temperature 0.6 --top-k 20 --top-p 0.95"; do
    n=sh$(echo $a | tr -d ' .-'); timeout 100 python bench/step_host.py --ctx 4096 --tokens 64 $a --out $OUT/$n \
    > $OUT/$n.txt 2>&1; echo "$a: $(grep -E '^decode step' $OUT/$n.txt)"; done
