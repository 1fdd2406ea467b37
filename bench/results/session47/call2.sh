#!/bin/bash
# session 47, call 2: bench/sweep.py on the GLM-5.2-width slice (the sweep warms max(c) prompts untimed first)
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
timeout 280 python bench/sweep.py --slice --isl 1024 --osl 128 --concurrency 1 8 32 64 --requests-per-client 2 \
    --chunk 8192 --warmup-tokens 2048 --out $OUT 2>&1 | grep -v '^loading' | tail -14
