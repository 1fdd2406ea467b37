#!/bin/bash
# session 43, call 3: the deploy file's prefill chunk (max_num_batched_tokens 8192) on the slice sized to 0.9 — free
# memory after a warm-up of contexts up to 16k and a 100k-token prompt; then the same at the shard shape (MLP / 8, one
# rank of tp 8)
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
TRITON_CACHE_DIR=$(mktemp -d) timeout 280 python bench/warmup.py --gpu-memory-utilization 0.9 --max-num-batched-tokens 8192 \
  --warmup-tokens 16384 --ctx 100000 --tokens 16 --out $OUT/warmup_8192.jsonl 2>&1 | grep -v '^loading' | tail -7 | tee $OUT/warmup_8192.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 280 python bench/warmup.py --gpu-memory-utilization 0.9 --max-num-batched-tokens 8192 \
  --mlp-shard 8 --warmup-tokens 16384 --ctx 100000 --tokens 16 --out $OUT/warmup_8192_shard.jsonl 2>&1 | grep -v '^loading' | tail -7 | tee $OUT/warmup_8192_shard.txt
