# Session 35, call 4: the full slice at 8 rows looked slower in call 3 (2.89 / 2.94 vs 2.82 / 2.85 ms) where the one
# change there is the dense MLP's gate and up in one rows-kernel launch: kernel times new / old (PDL off), the step
# new / old alternating three times; then the distributed GPU tests on this tree.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
GLMSERVE_PDL=0 timeout -s KILL 90 python bench/profile_slice.py --rows 8 > $OUT/profile_new.txt 2>&1
GLMSERVE_PDL=0 timeout -s KILL 90 env PYTHONPATH=ab_old:. python bench/profile_slice.py --rows 8 > $OUT/profile_old.txt 2>&1
head -n 12 $OUT/profile_new.txt | tail -n 9; echo "-- old"; head -n 12 $OUT/profile_old.txt | tail -n 9
for i in 1 2 3; do
  for t in new old; do
    p=.; [ $t = old ] && p=ab_old:.
    echo "$t $i $(timeout -s KILL 60 env PYTHONPATH=$p python bench/decode_slice.py --out /tmp/s --no-hf \
      --modes auto_graph --slices full 2>&1 | grep -E '^\| full \| 4096' | cut -d'|' -f3-4,10 | tr '\n' ' ')"
  done
done
timeout -s KILL 300 python -m pytest -v -rs tests/gpu/test_distributed_gpu.py > $OUT/test_distributed.log 2>&1
grep -E 'FAILED|ERROR|passed|failed' $OUT/test_distributed.log | tail -8
