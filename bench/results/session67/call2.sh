#!/bin/bash
# Session 67, call 2 (any card; call 1's H200 did not come): bench/warmup.py (MTP 3, warm-up to 8192 tokens, an empty
# Triton cache) on this tree — each per-row array of a step 16-byte aligned, the indexer's score width a multiple of
# 16 — and on the tree before (the three files at 958024a; the same bench, whose traffic now has long prompts whose
# prefix hits compute tails of 4 and 3 rows and one of a multiple of 16 tokens); then the indexer's GPU tests.
# old_tree/ held `git show 958024a:$f` of models/cache.py, glmkernels/reference.py, glmkernels/triton_attention.py
# (removed after the call).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
run() {   # $1: a name; in the current directory
    TRITON_CACHE_DIR=$(mktemp -d) timeout 260 python bench/warmup.py --warmup-tokens 8192 --spec 3 \
        --out $OUT/warmup_$1.jsonl > $OUT/warmup_$1.txt 2>&1
    echo "== $1"; grep -E '^pass|warm-up: done' $OUT/warmup_$1.txt | cut -c1-240
    python - $OUT/warmup_$1.jsonl <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
for p, res in enumerate(r["passes"]):
    print(p, [(round(list(x["ttft_ms"].values())[0]), [(n[:300], s) for n, s in x["compiled"]]) for x in res])
PY
}
run this
( time timeout 120 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "index" ) > $OUT/test_kernels_index.log 2>&1
echo "test_kernels_gpu -k index: $(grep -E 'passed|failed|error' $OUT/test_kernels_index.log | tail -1)"
rm -rf /tmp/old && mkdir /tmp/old && cp -r . /tmp/old/ && cp -r bench/results/session67/old_tree/* /tmp/old/ \
    && cd /tmp/old && run before
