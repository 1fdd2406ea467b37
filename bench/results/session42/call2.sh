#!/bin/bash
# session 42, call 2: the FP8 KV GPU tests as fixed after call 1 (the store against its own bf16 rows packed; the
# attention to a rounding), then bench/kv_fp8.py (attention and indexer scoring, bf16 vs packed rows), then the host tier
set -x
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
timeout 150 python -m pytest -q -s tests/gpu/test_kv_fp8_gpu.py 2>&1 | grep -v "^$" | tail -25 | tee $OUT/kv_fp8_tests.txt
timeout 200 python bench/kv_fp8.py --out $OUT/kv_fp8.md 2>&1 | tail -30
timeout 200 python bench/host_cache.py --slice --device cuda --system 8192 --turn 256 --answer 32 --kv 24576 \
    --host 262144 --chunk 8192 --out $OUT/host_cache_slice.md 2>&1 | tail -12
