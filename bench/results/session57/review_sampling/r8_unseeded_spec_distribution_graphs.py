"""(r7 on the static path: cuda_graphs eager, drafts picked between DraftGraphs passes, the 'drawn' mode.)
Unseeded sampled requests with MTP drafts (rejection sampling, k = 3) draw from plain decoding's distribution at the
engine level: the joint distribution of output tokens 2..4 (those verify rounds decide) over many runs of one prompt,
spec vs plain, two-sample chi-square — for top-k, and with frequency / presence penalties and a min_tokens ban (which
the draft distribution q and the target p must apply at the same positions). Exit 1 when p < 1e-3."""
import math
import sys
from collections import Counter
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
from common import SamplingParams, collect, engine, prompts  # noqa: E402

torch.manual_seed(0)
N = 300
ids = prompts(1)[0]
CASES = {"pen": SamplingParams(max_tokens=4, temperature=1.2, top_k=4, frequency_penalty=2.0, presence_penalty=1.0,
                               repetition_penalty=1.5, ignore_eos=True)}


def chi2_sf(x, k):
    """Wilson-Hilferty approximation of the chi-square survival function."""
    if k <= 0:
        return 1.0
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def two_sample(a: Counter, b: Counter):
    """Chi-square of two multinomial samples; sparse cells pooled into one."""
    na, nb = sum(a.values()), sum(b.values())
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rest = (na - sum(a[k] for k in keys), nb - sum(b[k] for k in keys))
    cells = [(a[k], b[k]) for k in keys] + ([rest] if sum(rest) else [])
    x = 0.0
    for ca, cb in cells:
        tot = ca + cb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        x += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    return x, len(cells) - 1


bad = []
plain, _ = engine()
spec, _ = engine(speculative_tokens=3, cuda_graphs="eager")
for name, params in CASES.items():
    samples = {}
    for ename, eng in (("plain", plain), ("spec", spec)):
        c = Counter()
        for i in range(N):
            t = collect(eng, {f"r{i}": (ids, params)})[f"r{i}"]["tokens"]
            c[tuple(t[1:4])] += 1
        samples[ename] = c
    x, df = two_sample(samples["plain"], samples["spec"])
    p = chi2_sf(x, df)
    m = spec.spec_metrics()
    if spec.stats["graph_steps"] == 0:
        bad.append("no graph step ran")
    print(f"{name}: chi2 {x:.1f} on {df} dof, p ~ {p:.3g}; spec acceptance so far {m['mean_accepted_length']:.2f}; "
          f"top plain {samples['plain'].most_common(3)} spec {samples['spec'].most_common(3)}")
    if p < 1e-3:
        bad.append(f"{name}: spec's distribution of tokens 2..4 differs from plain's (p ~ {p:.2g})")
print("\n".join(bad) or "distributions agree")
sys.exit(1 if bad else 0)
