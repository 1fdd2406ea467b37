#!/bin/bash
# Session 53, device call 2: call 1 showed the pinned buffer's fill on one thread as slow as the pageable copy (one
# host core's memcpy, ~6 GB/s): the fill now runs on up to 8 threads. The write's ways side by side (`fill`), then the
# stall A/B again (bf16 rows, pinned then pageable) and FP8 rows pinned.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
timeout 120 python bench/disagg.py fill --tokens 1024 4096 --out $OUT 2>&1 | tail -4 | cut -c1-300
timeout 130 python bench/disagg.py stall --device cuda --slice --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -4 | cut -c1-200
timeout 130 python bench/disagg.py stall --device cuda --slice --pageable --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -4 | cut -c1-200
timeout 130 python bench/disagg.py stall --device cuda --slice --fp8 --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -4 | cut -c1-200
ls $OUT
