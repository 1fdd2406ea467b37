# session 18, call 8 (one H200): graph steps' MoE up to 128 rows (GRAPH_MOE_ROWS / FUSED_MAX_ROWS 128: an 8-rank
# replica at 16 rows a rank — 128 running requests, the 8×H200 file's max_num_seqs — captured, not eager): the
# MoE GPU tests at 128 rows, 8 ipc ranks capturing buckets 8 and 16, fused (default = Gluon) vs grouped at 64 and
# 128 rows, the slice's 'rank of dp 8' at 1 / 8 / 16 rows a rank.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 100 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "moe or route" -p no:cacheprovider 2>&1 | tail -n 1
timeout 150 python -m pytest -q -x tests/gpu/test_distributed_gpu.py -k "eight_ranks" -p no:cacheprovider 2>&1 | tail -n 3
timeout 60 python bench/moe_prefill.py --fused --rows 64 128 2>&1 | grep "^I "
mkdir -p $OUT/slice
timeout 100 python bench/decode_slice.py --no-hf --modes auto_graph --out $OUT/slice 2>&1 >/dev/null | grep -v Warning | tail -n 3
grep -E '^\| (rank)' $OUT/slice/decode_slice.md
