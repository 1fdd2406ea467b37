#!/bin/bash
# session 48, call 3 (needs_h200: HF's bf16 slice and its cache do not fit an H100's 80 GB beside each other — call 1
# ran on an H100, where no HF row fit): the headline table on the current tree on an H200, HF included.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
( time timeout -s KILL 400 python bench/decode_slice.py --out $OUT/slice ) 2>&1 | tail -22 | cut -c1-200
