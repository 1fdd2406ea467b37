# session 19, call 3 (one H200): the distributed GPU tests call 2's -k filter left out (their argument names hold
# "moe"), then the warm-up's cost by max_num_seqs (8 / 16: buckets to 8 / 16 rows, as session 16 and 18 captured;
# 64: to 64, the default's), one Triton cache (the first run compiles).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=. TRITON_CACHE_DIR=$(mktemp -d)
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_distributed_gpu.py -k "greedy_tokens or span_matches" \
  2>&1 | tail -n 3
for seqs in 16 64 16 64; do
  timeout 90 python bench/warmup.py --warmup-tokens 16384 --spec 3 --max-num-seqs $seqs 2>&1 | grep '^{' | \
    python -c "import json,sys; r=json.loads(sys.stdin.read()); w=r['warmup']; print(r['max_num_seqs'], w['graph_steps'], round(w['capture_s'], 1), round(r['build_s'], 1), r['graphs_warmed'], r['graphs_after'])"
done
