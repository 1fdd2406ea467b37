# session 19, call 5 (one H200): where the many-row graph steps go — kernel times of a rank of dp 8 at 8 and 32 rows a
# rank (MoE over 64 / 256 rows at I 256) and of the full slice in one process at 32 and 64 rows (I 2048).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python bench/profile_slice.py --shard --dp --rows 8 32 2>&1 | grep -v Warning | head -n 70
timeout 200 python bench/profile_slice.py --rows 32 64 2>&1 | grep -v Warning | head -n 70
