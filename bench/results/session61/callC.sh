#!/bin/bash
# Session 61, device call C (as sessions 59–60 wrote it; no H200 came then) (needs_h200: HF's bf16 slice and its cache do not fit an H100 beside each other): the
# headline table on this session's tree, HF included — a regression check of the decode step since session 48's run
# and another host's HF time for "≥ 20× HF" at 4k × 1.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
( time timeout -s KILL 420 python bench/decode_slice.py --out $OUT/slice ) 2>&1 | tail -22 | cut -c1-260
# the top-k selection with ties broken by id (session 61's sampler fix) beside session 60's
( time timeout -s KILL 120 python bench/results/session61/topk_ties.py ) 2>&1 | tail -14
