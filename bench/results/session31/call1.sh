#!/bin/bash
# Session 31, call 1: the sparse attention's launch shapes with the slots read a step ahead (new) vs the committed
# kernel at its picks (old, ab_old/); the prefill chunk's default shape old / new; the graph tests and the MLA
# kernel tests on the new kernel (old picks).
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT/old $OUT/new
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
PYTHONPATH=ab_old:. timeout 120 python ab_old/bench/tune_attention.py --mla-only --picks-only --rows 1 2 4 8 16 \
    --out $OUT/old > $OUT/old/tune.log 2>&1
PYTHONPATH=. timeout 300 python bench/tune_attention.py --mla-only --rows 1 2 4 8 16 --out $OUT/new \
    > $OUT/new/tune.log 2>&1
for t in old new; do
  P=$([ $t = old ] && echo ab_old:. || echo .)
  PYTHONPATH=$P timeout 60 python $([ $t = old ] && echo ab_old/)bench/mla_prefill.py --default-only \
      > $OUT/$t/prefill.log 2>&1
done
PYTHONPATH=. timeout 200 python -m pytest -q -x tests/gpu/test_graphs_gpu.py > $OUT/test_graphs.log 2>&1
PYTHONPATH=. timeout 60 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "mla" > $OUT/test_mla.log 2>&1
tail -3 $OUT/*/tune.log $OUT/*/prefill.log $OUT/test_*.log
