# Session 34, call 1: the ep rank's MoE picks in a GPU test (session 33 left them untested there) and the down launch
# taking output blocks in turn; a dp step's MoE past 8 rows (I 256) with other down launches; Nsight Compute on the
# 256-row launches; the sparse attention's shapes at 16 / 32 rows with more programs an SM.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
timeout -s KILL 150 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "gluon_moe" > $OUT/test_gluon_moe.log 2>&1
tail -3 $OUT/test_gluon_moe.log
timeout -s KILL 190 python bench/moe_few_rows.py --inter 256 --rows 64 128 256 --draws 3 --down --out $OUT 2>&1 \
  | tail -4
for k in _moe_gate_up_kernel _moe_down_kernel; do
  timeout -s KILL 45 ncu --clock-control none -k regex:$k --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section SchedulerStats \
      python bench/results/session34/moe_ncu.py 256 > $OUT/ncu_256$k.txt 2>&1
done
timeout -s KILL 110 python bench/tune_attention.py --mla-only --rows 32 --out $OUT > $OUT/tune.log 2>&1
tail -n 8 $OUT/tune_attention.md
