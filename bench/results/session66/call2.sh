#!/bin/bash
# Session 66, call 2 (any card): a replica's cold start with mixed traffic (bench/warmup.py: a request alone, four
# drawn alike, four drawn each its own way) on this tree and on session 65's (old66/: its engine, runner and sampler,
# whose warm-up met only one sampling setting at a time), each in a fresh process with an empty Triton cache; then the
# graph tests (not run on a GPU since session 64's no-rows fix).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
run() { TRITON_CACHE_DIR=$(mktemp -d) timeout 170 python bench/warmup.py --warmup-tokens 4096 --out $OUT/warmup.jsonl \
        > $OUT/warmup_$1.txt 2>&1; echo "== $1"; grep -E '^pass|warm-up: done' $OUT/warmup_$1.txt | cut -c1-300; }
run new
mkdir -p /tmp/new && cp -r cluster workers /tmp/new/ && cp -r old66/cluster old66/workers . && run old
cp -r /tmp/new/cluster /tmp/new/workers .
( time timeout 250 python -m pytest -q -rs -x tests/gpu/test_graphs_gpu.py ) > $OUT/test_graphs_gpu.log 2>&1
echo "test_graphs_gpu: $(grep -E 'passed|failed|error' $OUT/test_graphs_gpu.log | tail -1)"
