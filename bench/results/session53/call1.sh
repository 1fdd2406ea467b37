#!/bin/bash
# Session 53, device call 1: the imports through pinned memory (`ImportWriter`) — the disagg GPU tests (with the new
# case: imports a block a step beside decoding streams on graphs), the stall A/B on the slice (bf16 rows: pinned, then
# pageable as before), and the transfer legs at full depth (the staged write beside the pageable one).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 170 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py ) > $OUT/test_disagg_gpu.log 2>&1; tail -4 $OUT/test_disagg_gpu.log
timeout 140 python bench/disagg.py stall --device cuda --slice --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -6 | cut -c1-200
timeout 140 python bench/disagg.py stall --device cuda --slice --pageable --tokens 8192 32768 131072 --out $OUT 2>&1 | tail -6 | cut -c1-200
timeout 100 python bench/disagg.py transfer --device cuda --tokens 8192 32768 --out $OUT 2>&1 | tail -8 | cut -c1-250
ls $OUT
