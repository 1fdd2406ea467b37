# session 18, call 7 (one H200): HEAD (ROUTE_BLOCK 32): routing / MoE GPU tests, the slice's table (no HF) and a
# batch of 12 / 16 requests decoding.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 120 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "moe or route" -p no:cacheprovider 2>&1 | tail -n 1
mkdir -p $OUT/slice
timeout 150 python bench/decode_slice.py --no-hf --out $OUT/slice 2>&1 >/dev/null | grep -v Warning | tail -n 3
grep -E '^\| (full|shard|rank)' $OUT/slice/decode_slice.md
timeout 120 python bench/batch_decode.py --requests 12 16 --ctx 4096 2>&1 | grep "^{"
