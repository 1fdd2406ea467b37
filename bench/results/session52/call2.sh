#!/bin/bash
# Session 52, device call 2: the issue-8 headline table on this tree (HF beside it where the card holds HF's bf16 slice
# and cache: an H200), then the kernels' GPU tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
hf=$([ "$mem" -gt 100000 ] && echo "" || echo "--no-hf")
( time timeout -s KILL 300 python bench/decode_slice.py --out $OUT/slice $hf ) 2>&1 | tail -22 | cut -c1-200
( time timeout 240 python -m pytest -q -x tests/gpu/test_kernels_gpu.py tests/gpu/test_kv_fp8_gpu.py ) > $OUT/test_kernels_gpu.log 2>&1; tail -4 $OUT/test_kernels_gpu.log
