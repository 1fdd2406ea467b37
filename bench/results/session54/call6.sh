#!/bin/bash
# Session 54, device call 6 (the same warm machine as call 5): FP8 rows, session 53's tree vs this one.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
mkdir -p /tmp/old && cp -r cluster models workers scheduler glmkernels bench /tmp/old/ && cp -r _t53/* /tmp/old/
# (_t53/: session 53's final tree's six files this session changed, made here before the call and not kept —
#  for f in bench/disagg.py cluster/{disagg,engine,coordinator}.py models/cache.py workers/runner.py; do
#    mkdir -p _t53/$(dirname $f); git show 0bab5b8:$f > _t53/$f; done)
(cd /tmp/old && timeout 90 python bench/disagg.py stall --device cuda --slice --fp8 --tokens 8192 32768 131072 --out $OUT/old 2>&1 | grep "writing steps" | sed 's/^/old /' | cut -c1-250)
timeout 90 python bench/disagg.py stall --device cuda --slice --fp8 --tokens 8192 32768 131072 --out $OUT/new 2>&1 | grep "writing steps" | sed 's/^/new /' | cut -c1-250
