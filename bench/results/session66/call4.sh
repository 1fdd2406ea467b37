#!/bin/bash
# Session 66, call 4 (any card; call 3's H200 never came): a replica's cold start on this tree with MTP
# (bench/warmup.py with a prompt of three prefill chunks in its traffic): does anything compile while serving?
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 280 python bench/warmup.py --warmup-tokens 4096 --spec 3 --out $OUT/warmup.jsonl \
    > $OUT/warmup_spec3.txt 2>&1; grep -E '^pass|warm-up: done' $OUT/warmup_spec3.txt | cut -c1-300
