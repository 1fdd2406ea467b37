#!/bin/bash
# Session 66, call 3 (needs_h200: HF's bf16 slice and its cache do not fit an H100 beside ours): the headline table on
# this tree with HF (session 48's is the last on an H200); then bench/warmup.py with MTP.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout -s KILL 330 python bench/decode_slice.py --out $OUT/slice ) > $OUT/slice.txt 2>&1
tail -22 $OUT/slice.txt | cut -c1-260
# and a replica's cold start on this tree with MTP (bench/warmup.py, now with a prompt of three prefill chunks too)
TRITON_CACHE_DIR=$(mktemp -d) timeout 200 python bench/warmup.py --warmup-tokens 4096 --spec 3 --out $OUT/warmup.jsonl \
    > $OUT/warmup_spec3.txt 2>&1; grep -E '^pass|warm-up: done' $OUT/warmup_spec3.txt | cut -c1-300
