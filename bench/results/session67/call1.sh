#!/bin/bash
# Session 67, call 1 (needs_h200: HF's bf16 slice and its cache do not fit an H100 beside ours): the headline table on
# this tree with HF (session 48's is the last on an H200); then session 66's call 5 again (bench/warmup.py, MTP 3,
# warm-up to 8192 tokens), whose JSON now keeps each compile's specialization: which `_index_score_kernel` variant the
# long prompt's prefix hit meets.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
( time timeout -s KILL 280 python bench/decode_slice.py --out $OUT/slice ) > $OUT/slice.txt 2>&1
tail -22 $OUT/slice.txt | cut -c1-260
TRITON_CACHE_DIR=$(mktemp -d) timeout 280 python bench/warmup.py --warmup-tokens 8192 --spec 3 --out $OUT/warmup.jsonl \
    > $OUT/warmup_spec3.txt 2>&1; grep -E '^pass|warm-up: done' $OUT/warmup_spec3.txt | cut -c1-300
python - <<'PY'
import json, os
r = [json.loads(l) for l in open(os.environ["OUT"] + "/warmup.jsonl")][-1]
print("prompt lengths", r["warmup"]["prompt_lengths"])
for p, res in enumerate(r["passes"]):
    print(p, [(list(x["ttft_ms"])[0], x["compiled"]) for x in res])
PY
