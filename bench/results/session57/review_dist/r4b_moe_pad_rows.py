"""r4b: the cause of r4 — one process, no comm: an MLP / MoE layer's output for the real rows changes when zero pad rows sit
beside them in the bucket (the pads are routed like real rows: Router -> Experts, models/glm5.py MoE.forward, and join
the experts' GEMMs in glmkernels/reference.py moe_experts, changing each expert's M). A span and a dp bucket of the same
request carry different numbers of pad rows (span: next_pow2(max(N, rows)); dp: N x next_pow2(busiest rank's rows)), so
their outputs differ in the last bits. The dense MLP layers show it too (the CPU fp32 GEMM rounds a row differently for
another M). Exits 1 when pad rows change real rows."""
import sys
from _common import TINY
import torch
from glmkernels import ops
from models.loader import load_model


def main():
    ops.configure("reference", "cpu", {})
    model = load_model(TINY, dtype=torch.float32, progress=False)
    torch.manual_seed(0)
    bad = []
    for layer in range(len(model.model.layers)):
        mlp = model.model.layers[layer].mlp
        kind = type(mlp).__name__
        for n, pad in ((3, 1), (4, 4), (5, 11), (18, 14), (18, 46), (32, 32)):
            x = torch.randn(n, model.config.hidden_size)
            alone = mlp(x)
            padded = mlp(torch.cat([x, torch.zeros(pad, x.shape[1])]))[:n]
            diff = (alone - padded).abs().max().item()
            if not torch.equal(alone, padded):
                bad.append((layer, kind, n, pad, diff))
            print(f"layer {layer} {kind:4s} rows {n:2d} + {pad:2d} pad rows: equal {torch.equal(alone, padded)} "
                  f"(max diff {diff:.1e})")
    print(f"{len(bad)} (layer, rows, pads) cases where zero pad rows changed the real rows' MLP output")
    print("RESULT:", "FAIL" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
