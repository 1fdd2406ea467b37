# Session 36, call 7: after call 6 — q_b / wq_b at 65..128 rows on 64-row tiles (its 128-row tiles two an SM are more
# than a wave), a 2-deep ring for 128-row tiles past 128 rows where there are two tiles an SM: the mid-size kernels'
# GPU tests and every group's pick against its launches apart at 128 / 256 rows.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout -s KILL 120 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "gluon_mid or linear_group" > $OUT/test_mid.log 2>&1
tail -n 1 $OUT/test_mid.log
timeout -s KILL 100 python bench/linear_group.py --out $OUT --rows 128 256 > $OUT/linear_group.log 2>&1
tail -n 12 $OUT/linear_group.md | cut -d"|" -f2-6,8
