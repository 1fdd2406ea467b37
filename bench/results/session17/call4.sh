# session 17, call 4 (one H200): the fused MoE past 32 rows takes an expert's run in chunks of 16 pairs a program
# (route_pairs gives each sorted pair its run's start) — GPU tests of the MoE and routing; fused (chunks / whole
# runs, K steps) vs grouped at 33–64 rows; and whether the grouped launches can be captured at all.
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 200 python -m pytest -q tests/gpu/test_kernels_gpu.py -k "moe or route" 2>&1 | tail -n 4
timeout 200 python bench/moe_prefill.py --fused --rows 33 48 64 2>&1 | grep "^I "
timeout 60 python - <<'PY' 2>&1 | tail -n 2
import torch
from bench.moe_prefill import experts, DEV, BF16, H, E, K
from kernels.triton_moe import grouped_moe
weights = experts(256)
x = torch.randn(64, H, device=DEV).to(BF16)
idx = torch.rand(64, E, device=DEV).topk(K, dim=1).indices
w = torch.rand(64, K, device=DEV)
grouped_moe(x, idx, w, *weights)
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        grouped_moe(x, idx, w, *weights)
    print("grouped_moe captured")
except Exception as e:
    print("grouped_moe capture failed:", type(e).__name__, str(e).splitlines()[0][:200])
PY
