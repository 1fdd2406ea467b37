"""One dp step's MoE at a tp rank's width (256 experts of 6144 × 256, top-8, ROWS rows) called a few times, for
Nsight Compute to profile one gate/up and one down launch: ``python moe_ncu.py ROWS``."""

import sys

import torch

from glmkernels.triton_moe import fused_moe

H, E, I, K = 6144, 256, 256, 8
rows = int(sys.argv[1])
torch.manual_seed(0)
ws = [(torch.empty(E, a, b, device="cuda").uniform_(-200, 200).to(torch.float8_e4m3fn),
       torch.rand(E, a // 128, b // 128, device="cuda") * 1e-3) for a, b in ((I, H), (I, H), (H, I))]
x = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16)
idx = torch.stack([torch.randperm(E, device="cuda")[:K] for _ in range(rows)])
w = torch.rand(rows, K, device="cuda")
for _ in range(4):
    fused_moe(x, idx, w, ws[0][0], ws[1][0], ws[2][0], ws[0][1], ws[1][1], ws[2][1], n_experts=E)
torch.cuda.synchronize()
