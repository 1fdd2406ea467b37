#!/bin/bash
# Session 53, device call 4: call 3 showed a round's first writes at 46-217 ms — pinning a new buffer (cudaHostAlloc,
# ~1 GB/s) each time a step's bytes outgrew the kept one: buffers now grow to a power of two; 4 helpers by default.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
for args in "" "--fp8" "--pageable"; do
  timeout 100 python bench/disagg.py stall --device cuda --slice $args --tokens 8192 32768 131072 --out $OUT 2>&1 | grep "writing steps" | cut -c1-300
done
ls $OUT
