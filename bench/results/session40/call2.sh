#!/bin/bash
# session 40, call 2: bench/prefix_cache.py on the slice, the warm-up now as long as the first turn (call 1's turn 0
# paid the long context's kernel compiles), system prompts of 16k and 64k tokens
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
timeout 250 python bench/prefix_cache.py --slice --device cuda --system 16384 --turn 256 --answer 64 --turns 4 \
    --burst 8 --chunk 8192 --out $OUT/prefix_cache_slice16k.md 2>&1 | tail -14
timeout 300 python bench/prefix_cache.py --slice --device cuda --system 65536 --turn 256 --answer 64 --turns 3 \
    --burst 2 --chunk 8192 --out $OUT/prefix_cache_slice64k.md 2>&1 | tail -14
