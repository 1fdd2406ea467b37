# session 18, call 6 (one H200): the routing kernel as a grid of ROUTE_BLOCK-pair programs (one program ranked all
# 512 pairs of 64 rows: 115 µs a launch in call 5's profile): its time by block at 8–64 rows; MoE / routing GPU
# tests; the 8-rank dp step's profile and decode_slice A/B against call 3's kernels (.old_rev: the commit before the routing change).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
python - <<'PY' 2>&1 | grep -v Warning
import torch
from bench.rows_gemm import graph_us
from kernels import triton_moe
for rows in (8, 16, 32, 64):
    idx = torch.stack([torch.randperm(256, device="cuda")[:8] for _ in range(rows)])
    cells = []
    for block in (16, 32, 64, 128, 1024):
        triton_moe.ROUTE_BLOCK = block
        cells.append(f"{block}: {graph_us([lambda: triton_moe.route_pairs(idx, 0, 256)] * 20):.1f}")
    print(f"route_pairs, {rows} rows ({rows * 8} pairs), µs by ROUTE_BLOCK — " + ", ".join(cells), flush=True)
PY
timeout 150 python -m pytest -q -x tests/gpu/test_kernels_gpu.py -k "moe or route" -p no:cacheprovider 2>&1 | tail -n 2
GLMSERVE_PDL=0 timeout 90 python bench/profile_slice.py --shard --dp --rows 8 2>&1 | grep -v Warning | tail -n 32 | head -n 10
mkdir -p $OUT/old $OUT/new
for rev in old new; do
  pp=.; [ $rev = old ] && pp=.old_rev:.
  PYTHONPATH=$pp timeout 100 python bench/decode_slice.py --no-hf --modes auto_graph --out $OUT/$rev 2>&1 >/dev/null | grep -v Warning | tail -n 3
  grep -E '^\| (shard|rank)' $OUT/$rev/decode_slice.md | head -4
done
