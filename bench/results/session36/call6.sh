# Session 36, call 6: where a rank of dp 8's 16- and 32-row steps go with the new picks, kernel by kernel in launch
# order (PDL off: kernel-alone times; session 35's call 1 is the same before them); q_b / wq_b at 128 rows and the
# dense gate / up at 256 swept again (the two groups whose pick lost to their launches apart in call 4).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
GLMSERVE_PDL=0 timeout -s KILL 200 python bench/profile_slice.py --shard --dp --rows 16 32 --sequence \
  > $OUT/profile_dp.txt 2>&1
grep -A 12 "== rows" $OUT/profile_dp.txt | cut -c1-70
timeout -s KILL 100 python bench/linear_group.py --out $OUT --rows 128 256 --sweep --groups "q_b, wq_b" "gate, up (dense)" \
  > $OUT/linear_group.log 2>&1
tail -n 4 $OUT/linear_group.md
