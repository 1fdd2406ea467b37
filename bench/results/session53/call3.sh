#!/bin/bash
# Session 53, device call 3: call 2 showed first writes of a round at 20-60 ms (pinned memory allocated per step) and
# 8-16 helper threads slower than 4 at 56 MB (a task a tensor): the pinned buffers are kept now (two, in turn) and each
# helper copies one run of the buffer. The write's ways, then the stall: bf16 pinned, FP8 pinned, bf16 pageable.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
timeout 100 python bench/disagg.py fill --tokens 1024 4096 --out $OUT 2>&1 | tail -2 | cut -c1-300
for args in "" "--fp8" "--pageable"; do
  timeout 120 python bench/disagg.py stall --device cuda --slice $args --tokens 8192 32768 131072 --out $OUT 2>&1 | grep "^|.*[0-9] |\|writing steps" | cut -c1-300
done
ls $OUT
