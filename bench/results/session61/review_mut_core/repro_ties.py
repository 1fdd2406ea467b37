"""Repro: a top-k cut inside a tie keeps batch-dependent ids (workers/sampler.py _filtered_weights, topk selection)."""
import torch

from scheduler.request import SamplingParams
from workers.sampler import probs_for_rows, sample

torch.manual_seed(0)
V = 5000                                            # > TOPK_SELECT: a row without top-k sorts the whole row
row = (torch.randn(1, V) * 2).bfloat16().float()    # bf16 logits: ties are common
vals = row[0].sort(descending=True).values
other = SamplingParams(top_p=0.9)                   # top-k off: the batch takes the sorted path
ties = [k for k in range(2, 100) if vals[k - 1] == vals[k]]     # top-ks whose cut falls inside a tie
bad = []
for k in ties:
    p = SamplingParams(top_k=k, seed=7)
    alone = probs_for_rows(row, [p])[0] > 0
    batched = probs_for_rows(torch.cat([row, row]), [p, other])[0] > 0
    if not torch.equal(alone, batched):
        bad.append(k)
print(f"top-k values 2..99 whose cut falls inside a tie: {ties}; kept ids differ alone vs batched for: {bad}")
if not bad:
    raise SystemExit(0)         # (fixed in session 61: workers/sampler.py's ``_by_value_then_id``)
k = bad[0]
p = SamplingParams(top_k=k, seed=7)
alone = probs_for_rows(row, [p])[0] > 0
batched = probs_for_rows(torch.cat([row, row]), [p, other])[0] > 0
print(f"top_k={k}: kept ids alone == in a batch: {torch.equal(alone, batched)}; "
      f"only alone: {sorted(set(alone.nonzero().flatten().tolist()) - set(batched.nonzero().flatten().tolist()))}; "
      f"only batched: {sorted(set(batched.nonzero().flatten().tolist()) - set(alone.nonzero().flatten().tolist()))}")
diff = [i for i in range(200) if sample(row, [p], None, [i]).token_ids[0]
        != sample(torch.cat([row, row]), [p, other], None, [i, 0]).token_ids[0]]
print(f"seeded draws (seed 7, tokens 0..199) that differ alone vs batched: {len(diff)}, e.g. token indices {diff[:5]}")
