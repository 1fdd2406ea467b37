#!/bin/bash
# Session 32, call 3: the fused MoE at 2..8 rows with the shared expert, launch shapes over several routings
# (wave quantization: 2 rows' gate/up ran at 2.5 TB/s in call 2's profile, 4 rows' at 3.8).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 400 python bench/moe_few_rows.py --rows 2 3 4 5 6 8 --draws 4 --out $OUT 2>&1 | grep -v Warn
