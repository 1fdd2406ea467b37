"""Session 20: Gluon expert launches over the runs' chunks at 128 / 256 rows (a dp step's MoE over every rank's rows:
I 256 is a tp rank of 8; I 2048 whole experts) — K blocks a step, pairs a program, gate/up and down widths —
each checked against the Triton tile kernels, timed as a graph replay (route + gate/up + down + combine), and the
step's kernels apart (torch.profiler) for the default launch.

    PYTHONPATH=. python bench/results/session20/moe_wide_sweep.py
"""

from __future__ import annotations

import torch

from bench.profile_slice import kernel_times
from bench.rows_gemm import graph_us
from glmkernels.gluon_rows import MoeTile, moe_tile
from glmkernels.triton_moe import expert_tiles, fused_moe
from glmkernels.triton_utils import num_sms

DEV, H, E, K = "cuda", 6144, 256, 8


def tiles() -> dict[str, MoeTile]:
    out = {}
    for bi, bo, sub, pairs in [(64, 64, 2, 16), (64, 64, 1, 16), (64, 64, 4, 16), (64, 128, 2, 16), (32, 64, 2, 16),
                               (64, 64, 2, 8), (128, 64, 2, 8), (64, 64, 1, 8), (64, 64, 2, 32)]:
        w = {32: 2, 64: 4, 128: 8}
        out[f"{bi}/{bo}/{sub}/{pairs}"] = MoeTile(bi, 1, bo, sub, w[bi], w[bo], pairs, True)
    return out


def main() -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    for I in (256, 2048):
        ws = [torch.empty(E, a, b, device=DEV).uniform_(-200, 200).to(torch.float8_e4m3fn)
              for a, b in ((I, H), (I, H), (H, I))]
        ss = [torch.rand(E, a // 128, b // 128, device=DEV, generator=g) * 1e-3 + 1e-4
              for a, b in ((I, H), (I, H), (H, I))]
        for M in (128, 256):
            x = torch.randn(M, H, device=DEV, generator=g).to(torch.bfloat16)
            idx = torch.rand(M, E, device=DEV, generator=g).topk(K, dim=1).indices
            wr = torch.rand(M, K, device=DEV, generator=g)

            def call(t, x=x, idx=idx, wr=wr, ws=ws, ss=ss):
                return fused_moe(x, idx, wr, *ws, *ss, tiles=t)
            ref = call(expert_tiles(M, H, I)).float()
            default = moe_tile(H, I, min(M * K, E), num_sms(), M)
            res = {}
            for name, t in {"default": default, **tiles()}.items():
                err = ((call(t).float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (I, M, name, err)
                res[name] = graph_us([lambda t=t: call(t)])
            print(f"I={I} M={M} default {default}: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                                sorted(res.items(), key=lambda kv: kv[1])), flush=True)
            kt = kernel_times(lambda d=default: call(d), 20)
            print("   kernels: " + "; ".join(f"{n[:40]} {t:.1f} µs ×{c:.0f}" for n, (t, c) in
                                             sorted(kt.items(), key=lambda kv: -kv[1][0])), flush=True)


if __name__ == "__main__":
    main()
