"""Session 13 call 3: why the W8A8 GPU tests failed (act_quant codes, MoE errors), and torch._scaled_mm's
block-scaled FP8 GEMM (cuBLAS, 1x128 activations x 128x128 weights) against our Triton GEMM on the slice's shapes."""
import sys
from functools import partial

import torch

from bench.decode_slice import time_ms
from bench.kernels_micro import rand_fp8
from bench.prefill_w8a8 import LINEARS
from glmkernels import reference
from glmkernels.triton_w8a8 import act_quant, w8a8_linear, w8a8_moe

DEV, BF16 = "cuda", torch.bfloat16
g = torch.Generator(device=DEV).manual_seed(51)
x = torch.randn(300, 6144 + 64, device=DEV, generator=g).to(BF16)
x[7] = 0
wide = torch.randn(64, 1000, device=DEV, generator=g) * torch.logspace(-6, 6, 64, device=DEV)[:, None]
for name, rows in (("bf16", x), ("wide", wide)):
    q, s = act_quant(rows)
    rq, rs = reference.act_quant(rows)
    ds = (s != rs).nonzero()
    dq = (q.view(torch.uint8) != rq.view(torch.uint8)).nonzero()
    print(name, "scale mismatches", len(ds), "code mismatches", len(dq))
    for r, c in ds[:3].tolist():
        print("  s", r, c, s[r, c].item(), rs[r, c].item())
    for r, c in dq[:6].tolist():
        v = rows[r, c].float().item()
        print("  q", r, c, v, v / rs[r, c // 128].item(), q[r, c].float().item(), rq[r, c].float().item())
sys.stdout.flush()

from tests.gpu.test_kernels_gpu import moe_args

for N, off, I in ((257, 0, 2048), (600, 16, 256)):
    args = moe_args(60 + N + I, N, I, 32, off)
    got = w8a8_moe(*args[:-1], expert_offset=off)
    r32 = reference.moe_experts_w8a8(args[0].float(), *args[1:])
    r16 = reference.moe_experts_w8a8(*args)
    a16 = reference.moe_experts(args[0].float(), *args[1:])
    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()
    print(f"moe N {N} I {I}: vs w8a8 ref fp32 rows {rel(got, r32):.2e}, bf16 rows {rel(got, r16):.2e}; "
          f"ref bf16 vs fp32 {rel(r16, r32):.2e}; vs W8A16 fp32 {rel(got, a16):.2e}", flush=True)


def scaled_mm(x, w8, s):
    q, qs = act_quant(x)
    return torch._scaled_mm(q, w8.t(), qs.t().contiguous().t(), s.t(), out_dtype=x.dtype)


print(torch.__version__, torch.version.cuda)
for name, (N, K) in LINEARS.items():
    w8, s = rand_fp8(N, K)
    for M in (2048, 8192):
        xx = torch.randn(M, K, device=DEV, generator=g).to(BF16)
        try:
            y = scaled_mm(xx, w8, s)
            err = ((y.double() - reference.linear_w8a8(xx.float(), w8, s).double()).norm()
                   / reference.linear_w8a8(xx.float(), w8, s).double().norm()).item()
            t = time_ms(partial(scaled_mm, xx, w8, s), 10)
        except Exception as e:  # noqa: BLE001
            print(name, M, "scaled_mm failed:", str(e)[:300], flush=True)
            continue
        tt = time_ms(partial(w8a8_linear, xx, w8, s), 10)
        f = 2 * M * N * K / 1e9
        print(f"{name:>15} {M:>5}: scaled_mm {t:.3f} ms ({f / t:.0f} TFLOP/s, rel {err:.1e}); triton {tt:.3f} ms "
              f"({f / tt:.0f})", flush=True)
