# Session 35, call 1: where a rank of dp 8's 16- and 32-row steps go now, kernel by kernel in launch order
# (PDL off: kernel-alone times); the sparse attention's split count past 8 rows (16 / 32 / 64 rows, 1..12 splits).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
GLMSERVE_PDL=0 timeout -s KILL 240 python bench/profile_slice.py --shard --dp --rows 16 32 --sequence \
  > $OUT/profile_dp.txt 2>&1
tail -n 3 $OUT/profile_dp.txt
timeout -s KILL 200 python bench/tune_attention.py --mla-only --splits --rows 16 32 64 --out $OUT > $OUT/tune.log 2>&1
tail -n 4 $OUT/tune_attention.md
