#!/bin/bash
# Session 65, call 2 (any card): the sampler's new ops — the top-k without a topk (ops.top_k_race, a radix select by
# count before top-p's by mass), the kept weights without a sort (ops.kept_weights: speculative decoding's
# distributions) and the penalties in one launch (ops.penalize) — their GPU tests with the sampler's other kernels',
# then the sampler's cost per setting (sample_on_device, and probs_for_rows) with the Triton ops and with the reference
# (the path before: a sort or keys + topk, ~25 elementwise launches; the penalties' ~12) in the same run.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 200 python -m pytest -q -rs tests/gpu/test_sample_gpu.py ) > $OUT/sample_tests.log 2>&1
echo "sample tests: $(grep -E 'passed|failed|error' $OUT/sample_tests.log | tail -1)"; grep -E "^E " $OUT/sample_tests.log | head -8
for probs in "" "--probs"; do for k in auto reference; do n=sampler_$k$(echo $probs | tr -d ' -')
    timeout 100 python bench/sampler.py --kernels $k $probs --out $OUT/$n > $OUT/$n.txt 2>&1
    echo "== $k $probs"; grep -E "rows," $OUT/$n.txt; done; done
grep -A6 "1 rows, T 0.6, top-k 20" $OUT/sampler_auto.txt | cut -c1-120
