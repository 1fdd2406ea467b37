import sys; sys.path.insert(0, "/tmp/rev64w")
from adv import *
g = torch.Generator().manual_seed(int(sys.argv[1]))
t0 = time.time(); n = 0
while time.time() - t0 < float(sys.argv[2]):
    S = int(torch.randint(1, 5, (1,), generator=g)); V = int(torch.randint(1, 4200, (1,), generator=g))
    kind = int(torch.randint(0, 6, (1,), generator=g))
    scale = float(10 ** (torch.rand(1, generator=g) * 5 - 2))
    x = torch.randn(S, V, generator=g) * scale
    if kind == 1: x = x.bfloat16().float()
    if kind == 2: x = (x * 4).round() / 4                       # many ties
    if kind == 3: x = x.masked_fill(torch.rand(S, V, generator=g) < 0.8, -INF); x[:, -1] = 0.0
    if kind == 4: x[:, int(torch.randint(0, V, (1,), generator=g))] += 30
    if kind == 5: x = torch.where(torch.rand(S, V, generator=g) < 0.5, x, -29 - 10 * torch.rand(S, V, generator=g))
    choices = [1e-6, 0.01, 0.2, 0.5, 0.8, 0.9, 0.95, 0.99, INF]
    ps = [choices[int(i)] for i in torch.randint(0, len(choices), (S,), generator=g)]
    tp = torch.tensor(ps)[:, None] if torch.rand(1, generator=g) < 0.5 else ps[0]
    mp = [None, 0.05, torch.rand(S, 1, generator=g) * 0.3][int(torch.randint(0, 3, (1,), generator=g))]
    n += 1
    check_exact(f"fuzz{n} k{kind} V{V} s{scale:.3g}", x, tp, tol=1e-6)
    check(f"fuzz{n} k{kind} V{V} s{scale:.3g}/exp", x, exp_noise(x, g), tp, mp)
    check(f"fuzz{n} k{kind} V{V} s{scale:.3g}/probe", x, probe_noise(x), tp, None)
print("cases", n)
