#!/bin/bash
# Session 54, device call 5: call 4 found the host's bookkeeping between import steps on the critical path (the
# settle's keeps, ~4.4 us a block: 1.2 ms a 29 MB step, 4.4 ms a 64 MB one) with the GPU idle — look-ahead was off
# while a request waited. Now a request waiting for its imported KV leaves look-ahead on (the step whose write lands
# its last rows excepted), and the keeps' loop is leaner. The disagg GPU tests (graphs with look-ahead beside imports),
# then the stall A/B: session 53's tree (`_t53/`) vs this tree, paced and unpaced, alternating.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout 170 python -m pytest -q -rs tests/gpu/test_disagg_gpu.py ) > $OUT/test_disagg_gpu.log 2>&1; tail -4 $OUT/test_disagg_gpu.log
mkdir -p /tmp/old && cp -r cluster models workers scheduler glmkernels bench /tmp/old/ && cp -r _t53/* /tmp/old/
# (_t53/: session 53's final tree's six files this session changed, made here before the call and not kept —
#  for f in bench/disagg.py cluster/{disagg,engine,coordinator}.py models/cache.py workers/runner.py; do
#    mkdir -p _t53/$(dirname $f); git show 0bab5b8:$f > _t53/$f; done)
old() { (cd /tmp/old && timeout 100 python bench/disagg.py stall --device cuda --slice "$@" --tokens 8192 32768 131072 --out $OUT/old 2>&1 | grep "writing steps" | sed 's/^/old /' | cut -c1-250); }
new() { timeout 100 python bench/disagg.py stall --device cuda --slice "$@" --tokens 8192 32768 131072 --out $OUT/new 2>&1 | grep "writing steps" | sed "s/^/new $* /" | cut -c1-250; }
old; new; new --unpaced; old; new
ls $OUT $OUT/old $OUT/new
