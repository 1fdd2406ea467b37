# session 19, call 2 (one H200): the rest of the GPU tier (8 ipc ranks at 8 / 16 / 32 rows a rank among it), then the
# slice's table without HF ('rank of dp 8' now at 1 / 8 / 16 / 32 rows a rank).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 380 python -m pytest -q -p no:cacheprovider tests/gpu --ignore tests/gpu/test_graphs_gpu.py \
  -k "not (absorb or moe or route)" 2>&1 | tail -n 6
mkdir -p $OUT/slice
timeout 190 python bench/decode_slice.py --no-hf --out $OUT/slice 2>&1 >/dev/null | grep -v Warning | tail -n 3
grep -E '^\| (full|shard|rank)' $OUT/slice/decode_slice.md
