#!/bin/bash
# Session 55, device call 3: call 2's engine soak again, now that it runs without xgrammar (the image lacks it: no
# JSON-schema requests there).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 400 python -m pytest -q -rs tests/gpu/test_engine_soak_gpu.py ) > $OUT/test_engine_soak_gpu.log 2>&1
tail -n 25 $OUT/test_engine_soak_gpu.log | cut -c1-400
