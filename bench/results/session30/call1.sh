# Session 30, call 1: kernel-alone times (GLMSERVE_PDL=0) of the shard-shaped step at 8 rows (a span verify's rows on
# one tp rank of 8) and of the rank of dp 8, with one step's launch sequence; the 8-row step at full width.
export NCCL_NVLS_ENABLE=0 GLMSERVE_PDL=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
for a in "--rows 8 --shard --sequence" "--rows 1 8 --shard --dp" "--rows 8"; do
    echo "== $a"
    timeout -s KILL 150 python bench/profile_slice.py $a 2>&1 | grep -v -i warn
done 2>&1 | tee $OUT/profile.txt
