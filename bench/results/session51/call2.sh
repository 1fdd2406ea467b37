#!/bin/bash
# session 51, call 2 (needs_h200: HF's bf16 slice and its cache do not fit an H100 beside each other): the headline
# table of issue 8 on this tree and this host, HF included (whether >= 20x HF at 4k x 1 holds depends on HF's host).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt
( time timeout -s KILL 400 python bench/decode_slice.py --out $OUT/slice ) 2>&1 | tail -22 | cut -c1-200
