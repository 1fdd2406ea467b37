#!/bin/bash
# Session 53, device call 5: the writer kept the last two steps' rows alive with its buffers (freeing a bundle, ~20-50 ms
# of munmap, fell in the next round's first writes): it keeps only the fills and copy events now.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
for args in "" "--fp8" "--pageable"; do
  timeout 100 python bench/disagg.py stall --device cuda --slice $args --tokens 8192 32768 131072 --out $OUT 2>&1 | grep "writing steps" | cut -c1-300
done
ls $OUT
