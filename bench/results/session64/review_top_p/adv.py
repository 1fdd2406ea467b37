import os, sys, math, time
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "/tmp/rev64")
import torch
from glmkernels import reference
import glmkernels.triton_sample as ts
race = ts.top_p_race
INF = float("inf")
TINY = torch.finfo(torch.float32).tiny

def probe_noise(x):
    S, V = x.shape
    order = x.sort(dim=-1, descending=True, stable=True).indices
    rfe = torch.empty_like(order).scatter_(1, order, torch.arange(V - 1, -1, -1).expand(S, -1))
    w = torch.exp(x - x.amax(dim=-1, keepdim=True)).clamp(min=TINY)
    return w * (1 + 1e-4 * rfe)

def exp_noise(x, g):
    return torch.empty_like(x).exponential_(generator=g).clamp_(min=TINY)

def p_of(v, r):
    if isinstance(v, torch.Tensor): return float(v.reshape(-1)[r])
    return float(torch.tensor(v, dtype=torch.float32))

def exact(x, noise, top_p, min_p):
    """fp64 mass above (weights: the fp32 exp), kept = above < p*total; the race on fp32 ratios; returns
    ids and per-row the min relative gap |above - p*total|/total over tokens whose kept status differs... """
    S, V = x.shape
    top, order = x.sort(dim=-1, descending=True, stable=True)
    w = torch.exp(top - top[:, :1])
    w64 = w.double()
    above = w64.cumsum(-1) - w64
    tot = w64.sum(-1, keepdim=True)
    p = torch.tensor([[p_of(top_p, r)] for r in range(S)], dtype=torch.float64)
    kept = above < p * tot
    gap = ((above - p * tot) / tot)
    return order, w, kept, gap

def check(name, x, noise, top_p, min_p, verbose=True):
    got = race(x, noise, top_p, min_p)
    want = reference.top_p_race(x, noise, top_p, min_p)
    S, V = x.shape
    bad = []
    if ((got < 0) | (got >= V)).any():
        print("OUT OF RANGE", name, got.tolist()); bad.append("oob")
    diff = (got != want).nonzero().flatten().tolist()
    for r in diff:
        order, w, kept, gap = exact(x[r:r+1], noise[r:r+1], top_p if not isinstance(top_p, torch.Tensor) else top_p[r:r+1], None)
        g, wn = int(got[r]), int(want[r])
        pos_g = int((order[0] == g).nonzero()) if 0 <= g < V else -1
        pos_w = int((order[0] == wn).nonzero())
        lo, hi = min(pos_g, pos_w), max(pos_g, pos_w)
        gaps = gap[0, lo:hi + 1].abs().min().item() if pos_g >= 0 else None
        print(f"DIFF {name} row {r}: got {g} (pos {pos_g}, kept64 {bool(kept[0,pos_g]) if pos_g>=0 else None}, gap {gap[0,pos_g].item() if pos_g>=0 else None:.3e}) "
              f"want {wn} (pos {pos_w}, kept64 {bool(kept[0,pos_w])}, gap {gap[0,pos_w].item():.3e}) p={p_of(top_p, r)} minp={min_p if not isinstance(min_p, torch.Tensor) else float(min_p[r])}")
        bad.append(r)
    return bad

def exact_boundary(x, top_p):
    """the last kept position (in the order value, then id) per row by fp64 mass above (fp32 exp weights) and the
    gaps of the positions around it."""
    S, V = x.shape
    order, w, kept, gap = exact(x, None, top_p, None)
    out = []
    for r in range(S):
        k = int(kept[r].sum())   # kept is a prefix
        out.append((int(order[r, k - 1]), k, gap[r]))
    return out

def check_exact(name, x, top_p, tol=1e-8):
    noise = probe_noise(x)
    got = race(x, noise, top_p, None)
    S, V = x.shape
    for r, (tok, k, gap) in enumerate(exact_boundary(x, top_p)):
        if int(got[r]) != tok:
            # edge if some position near has |gap| < tol
            order = x[r].sort(descending=True, stable=True).indices
            g = int(got[r]); pos = int((order == g).nonzero()) if 0 <= g < V else -1
            lo, hi = sorted((pos, k - 1))
            m = gap[lo:hi + 2].abs().min().item() if pos >= 0 else -1
            print(f"EXACTDIFF {name} row {r}: got {g} pos {pos}, exact {tok} pos {k-1}; min|gap| between {m:.2e} {'EDGE' if 0 <= m < tol else 'BUG?'} p={p_of(top_p, r)}")
