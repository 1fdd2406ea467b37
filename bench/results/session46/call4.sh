#!/bin/bash
# session 46, call 4 (H100, 185 s of device time left): bench/sweep.py on the GLM-5.2-width slice. It ran before the
# sweep's untimed warm level was added (its c=8 row's first step compiled the 8192-token prefill shape)
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
timeout 185 python bench/sweep.py --slice --isl 1024 --osl 128 --concurrency 1 8 32 64 --requests-per-client 2 \
    --chunk 8192 --warmup-tokens 2048 --out $OUT 2>&1 | grep -v '^loading' | tail -14
