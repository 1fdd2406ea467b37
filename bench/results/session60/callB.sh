#!/bin/bash
# Session 60, device call B (the H100 of call A, warm): worker groups over the channel and the engine soak after
# session 60's loader change (ranks of an engine that does not draft load no MTP layer), then the decode step on the
# slice without HF (`--no-hf`: a regression check against session 52's H100 run; HF's bf16 slice needs an H200).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/xg:. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
declare -A T=([test_distributed_gpu]=250 [test_engine_soak_gpu]=110)
for t in test_engine_soak_gpu test_distributed_gpu; do
  ( time timeout ${T[$t]} python -m pytest -q -rs tests/gpu/$t.py ) > $OUT/$t.log 2>&1; rc=$?
  echo "$t rc=$rc: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
( time timeout -s KILL 160 python bench/decode_slice.py --no-hf --out $OUT/slice ) 2>&1 | tail -16 | cut -c1-240
