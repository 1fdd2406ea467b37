# session 16, call 3 (one H200): the warm-up's capture time against the model's depth, to project a 78-layer
# replica's (MTP 3, contexts up to 16384 tokens at two widths an octave). One Triton cache for all runs: the first
# run compiles (its time is not the capture's), the later ones capture only.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=. TRITON_CACHE_DIR=$(mktemp -d)
for depth in 4 4 7 10; do
  timeout 200 python bench/warmup.py --warmup-tokens 16384 --spec 3 --depth $depth --out $OUT/warmup.jsonl 2>&1 \
    | grep -E "^pass|warm-up: done" | tail -n 5
done
python - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/warmup.jsonl"):
    r = json.loads(line); w = r["warmup"]
    print(r["depth"], w["graph_steps"], round(w["capture_s"], 2), round(w["capture_s"] / w["graph_steps"] * 1e3, 1), "ms/step",
          round(w["request_s"], 1), "s prompts", round(r["build_s"], 1), "s build")
PY
