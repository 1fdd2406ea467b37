#!/bin/bash
# Session 55, device call 5: the final tree (admission's request checks first, the guided and parser changes) on the
# GPU: the engine soak and the disaggregated-prefill tests.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; git log --oneline -1 2>/dev/null; } > $OUT/device.txt
cat $OUT/device.txt
( time timeout 450 python -m pytest -q -rs tests/gpu/test_engine_soak_gpu.py tests/gpu/test_disagg_gpu.py ) > $OUT/tests.log 2>&1
tail -n 8 $OUT/tests.log | cut -c1-300
