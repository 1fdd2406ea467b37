#!/bin/bash
# Session 66, call 5 (any card): call 4's cold start after the warm-up learnt a long prompt's chunks and prefix hits
# (warmup_tokens 8192 here, so that the bench's 4196-token prompt is within the warmed contexts: call 4's was not).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 280 python bench/warmup.py --warmup-tokens 8192 --spec 3 --out $OUT/warmup.jsonl \
    > $OUT/warmup_spec3.txt 2>&1; grep -E '^pass|warm-up: done' $OUT/warmup_spec3.txt | cut -c1-300
python - <<'PY'
import json, os
r = [json.loads(l) for l in open(os.environ["OUT"] + "/warmup.jsonl")][-1]
print("prompt lengths", r["warmup"]["prompt_lengths"])
for p, res in enumerate(r["passes"]):
    print(p, [(list(x["ttft_ms"])[0], x["compiled"]) for x in res])
PY
