#!/bin/bash
# Session 63, device call for an H100 (when no H200 comes: HF's bf16 slice does not fit one beside its cache): what
# sessions 61–62 changed and no GPU ran — drawn rows sampled on the device in the captured steps and the top-k with
# ties broken by id (session 61: the graph tests, `topk_ties.py`, `bench/sampler.py`), the CPU reference of the MLA
# core rounded once (session 62: the kernel tests compare with it) — then the decode step on the slice without HF
# (a regression check against session 60's H100 run).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
declare -A T=([test_graphs_gpu]=100 [test_kernels_gpu]=170)
for t in test_graphs_gpu test_kernels_gpu; do
  ( time timeout ${T[$t]} python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
( time timeout -s KILL 60 python bench/results/session61/topk_ties.py ) > $OUT/topk_ties.txt 2>&1; tail -14 $OUT/topk_ties.txt
( time timeout -s KILL 45 python bench/sampler.py --out $OUT ) > $OUT/sampler.txt 2>&1; grep -E "rows,|real" $OUT/sampler.txt
( time timeout -s KILL 170 python bench/decode_slice.py --no-hf --out $OUT/slice ) > $OUT/slice.txt 2>&1
tail -16 $OUT/slice.txt | cut -c1-240
