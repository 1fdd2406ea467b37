# Session 36, call 4 (on call 3's machine): the graph tests with the new picks; every group's pick against its
# weights launched apart at 2..256 rows (bench/linear_group.py, no sweep); a prompt of 200 tokens beside 16 decoders
# (mixed steps of ~216 rows: the past-128-rows picks), new / old.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 170 python -m pytest -q tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1
tail -n 2 $OUT/test_graphs.log
timeout -s KILL 150 python bench/linear_group.py --out $OUT --rows 2 8 16 32 64 128 192 256 > $OUT/linear_group.log 2>&1
tail -n 48 $OUT/linear_group.md | cut -d"|" -f2-6,8
for t in new old; do
  p=.; [ $t = old ] && p=ab_old:.
  echo "-- $t"; timeout -s KILL 75 env PYTHONPATH=$p python bench/mixed_steps.py --prompts 200 --modes pieces \
    --out $OUT/mixed_$t 2>&1 | tail -n 6
done
