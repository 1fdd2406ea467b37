#!/bin/bash
# Session 67, call 3 (any card): bench/warmup.py on this tree again with a KV pool that holds a pass's traffic (call 2's
# 16384 tokens evicted the first pass's prompts: its second pass's long prompts were partial hits), so that the
# second pass's long prompts are prefix hits of 4-, 3- and 1-row tails; then the GPU tests that run build_batch's
# steps and the indexer (its per-row arrays now padded to an even count; the score widths a multiple of 16).
pip install -q --no-deps --target /tmp/xg .wheels/*.whl 2>&1 | tail -1
export NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date; } > $OUT/device.txt; cat $OUT/device.txt
PYTHONPATH=. TRITON_CACHE_DIR=$(mktemp -d) timeout 250 python bench/warmup.py --warmup-tokens 8192 --spec 3 \
    --out $OUT/warmup.jsonl > $OUT/warmup.txt 2>&1
grep -E '^pass|warm-up: done' $OUT/warmup.txt | cut -c1-250
python - $OUT/warmup.jsonl <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
for p, res in enumerate(r["passes"]):
    print(p, [(round(list(x["ttft_ms"].values())[0]), x["cached_tokens"], [(n[:300], s) for n, s in x["compiled"]])
              for x in res])
PY
for t in test_graphs_gpu:150 test_engine_soak_gpu:60 test_kv_fp8_gpu:90 test_kernels_gpu:200; do
    ( time PYTHONPATH=/tmp/xg:. timeout ${t#*:} python -m pytest -q -rs -x tests/gpu/${t%:*}.py ) > $OUT/${t%:*}.log 2>&1
    echo "${t%:*}: $(grep -E 'passed|failed|error' $OUT/${t%:*}.log | tail -1)"
done
