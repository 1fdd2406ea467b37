#!/bin/bash
# Session 31, call 2: where the several-row sparse attention's time goes — the committed kernel with one stage left
# out at a time (mla_ablate.py); its launch shapes with 2-3 stages, 4..64 splits, fp32 / bf16 partials at 1..16 rows
# (bench/tune_attention.py --mla-only); Nsight Compute's view of one launch at 8 rows; the MLA kernel tests.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
timeout -s KILL 120 python bench/results/session31/mla_ablate.py --rows 1 8 16 > $OUT/ablate.md 2>&1
timeout -s KILL 270 python bench/tune_attention.py --mla-only --rows 1 4 8 16 --out $OUT > $OUT/tune.log 2>&1
for n in 8; do
  timeout -s KILL 60 ncu --clock-control none -k regex:_mla_split_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis \
      python bench/results/session31/mla_ablate.py --ncu-once $n > $OUT/ncu_rows$n.txt 2>&1
done
timeout -s KILL 90 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "mla" > $OUT/test_mla.log 2>&1
cat $OUT/ablate.md; tail -n 6 $OUT/tune_attention.md; grep -i -m3 "error" $OUT/ncu_rows8.txt
