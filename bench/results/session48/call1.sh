#!/bin/bash
# session 48, call 1: the headline table on the current tree (every decode_slice case, HF included; the last full one
# was session 34's), then the kernel tests whole (last whole in session 34, before sessions 35-38's kernel changes).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
( time timeout -s KILL 330 python bench/decode_slice.py --out $OUT/slice ) 2>&1 | tail -18 | cut -c1-160
timeout -s KILL 220 python -m pytest -q tests/gpu/test_kernels_gpu.py > $OUT/test_kernels.log 2>&1
tail -4 $OUT/test_kernels.log
