# Session 33, call 1: the committed tree's full decode_slice (HF included: the note's headline table is session 11's),
# then kernel-alone profiles of the cases furthest from their floors (shard 8 rows, rank of dp 8 at 8 / 32 rows a rank).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $OUT/gpu.txt
( time timeout -s KILL 330 python bench/decode_slice.py --out $OUT/slice ) > $OUT/slice.log 2>&1
tail -30 $OUT/slice.log
GLMSERVE_PDL=0 timeout -s KILL 90 python bench/profile_slice.py --shard --rows 8 --sequence > $OUT/profile_shard8.txt 2>&1
GLMSERVE_PDL=0 timeout -s KILL 100 python bench/profile_slice.py --shard --dp --rows 8 32 > $OUT/profile_dp.txt 2>&1
grep -A14 '^== rows' $OUT/profile_shard8.txt $OUT/profile_dp.txt | head -60
