#!/bin/bash
# Session 54, device call 2: rows sent after a step land after the next one (a side stream's copy beside its work),
# paced imports, reserved buffers. The disagg GPU tests (+ the writer's own), then the stall bench on the slice: session
# 53's final tree (0bab5b8's six changed files over this tree, `_t53/`) vs this tree paced and unpaced, alternating.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 170 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py ) > $OUT/test_disagg_gpu.log 2>&1; tail -4 $OUT/test_disagg_gpu.log
mkdir -p /tmp/old && cp -r cluster models workers scheduler glmkernels bench /tmp/old/ && cp -r _t53/* /tmp/old/
# (_t53/: session 53's final tree's six files this session changed, made here before the call and not kept —
#  for f in bench/disagg.py cluster/{disagg,engine,coordinator}.py models/cache.py workers/runner.py; do
#    mkdir -p _t53/$(dirname $f); git show 0bab5b8:$f > _t53/$f; done)
old() { (cd /tmp/old && timeout 100 python bench/disagg.py stall --device cuda --slice "$@" --tokens 8192 32768 131072 --out $OUT/old 2>&1 | grep "writing steps" | sed 's/^/old /' | cut -c1-270); }
new() { timeout 100 python bench/disagg.py stall --device cuda --slice "$@" --tokens 8192 32768 131072 --out $OUT/new 2>&1 | grep "writing steps" | sed "s/^/new $* /" | cut -c1-270; }
old; new; new --unpaced; old --fp8; new --fp8; old; new
ls $OUT $OUT/old $OUT/new
