#!/bin/bash
# Session 54, device call 1: the disagg GPU tests on session 53's final writer (not run on it then) with this session's
# pacing and reserve; the stall A/B on the slice: paced + reserved (this tree) vs unpaced + not reserved (session 53's
# behaviour, same tree), bf16 rows; then paced FP8 rows.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 170 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py ) > $OUT/test_disagg_gpu.log 2>&1; tail -4 $OUT/test_disagg_gpu.log
for args in "" "--unpaced --no-reserve" "--fp8"; do
  timeout 125 python bench/disagg.py stall --device cuda --slice $args --tokens 8192 32768 131072 --out $OUT 2>&1 | grep "writing steps" | cut -c1-400
done
ls $OUT
