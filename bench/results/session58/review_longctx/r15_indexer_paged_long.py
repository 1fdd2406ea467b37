"""The indexer on the static-shape path (``cuda_graphs: eager``: decode / verify rows score a padded block-table width,
two widths an octave, keys past a row's position masked) at long positions: every selection (paged or ragged) == the
top-32 of an independent float64 scoring over the row's visible keys (near-ties counted, not failed); tokens == the
model's own greedy loop; k = 0 and 3. Exit 1 on a set mismatch that is not a near-tie, or a token mismatch."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from glmkernels.reference import paged_slots
from models.glm5 import Indexer

stats = {"rows": 0, "paged_rows": 0, "past_topk": 0, "past_1024": 0, "ties": 0, "bad": 0, "widths": set()}
bad = []
orig_select = Indexer.select


def check_row(q, w, slots, keys, sel, scale, K):
    s = torch.einsum("hd,td->ht", q.double(), keys.double()) * scale
    score = (w.double()[:, None] * torch.relu(s)).sum(0)
    order = score.argsort(descending=True)
    kk = min(K, score.numel())
    if set(slots[order[:kk]].tolist()) == set(x for x in sel.tolist() if x >= 0):
        return "ok"
    if score.numel() > kk and abs(float(score[order[kk - 1]] - score[order[kk]])) <= 1e-6 * max(1.0, abs(float(score[order[kk - 1]]))):
        return "tie"
    return "bad"


def select(self, q, w, batch, k_cache):
    out = orig_select(self, q, w, batch, k_cache)
    cfg = self.cfg
    scale = cfg.index_head_dim ** -0.5
    rows = []
    if batch.block_table is not None:
        stats["widths"].add(int(batch.block_table.shape[1]))
        for r in range(batch.num_rows):
            pos = int(batch.positions[r])
            rows.append((r, pos, paged_slots(batch.block_table[r:r + 1], batch.block_size, pos + 1)[0]))
        stats["paged_rows"] += batch.num_rows
    else:
        for i, (r0, nr) in enumerate(batch.seq_rows):
            for r in range(r0, r0 + nr):
                pos = int(batch.positions[r])
                rows.append((r, pos, batch.seq_slots[i][:pos + 1]))
    for r, pos, slots in rows:
        stats["rows"] += 1
        if pos < cfg.index_topk:
            continue
        stats["past_topk"] += 1
        stats["past_1024"] += pos >= 1024
        res = check_row(q[r], w[r], slots, k_cache[slots].float(), out[r], scale, cfg.index_topk)
        if res != "ok":
            stats["ties" if res == "tie" else "bad"] += 1
            if res == "bad":
                bad.append((pos, batch.block_table is not None))
    return out


eng0, tok = engine()
cases = {"t": (text_prompt(tok, 1990, 71), 58), "r": (prompt_ids(1200, 72), 40)}
refs = {r: ref_greedy(p, n) for r, (p, n) in cases.items()}
Indexer.select = select
for k in (0, 3):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, speculative_tokens=k, cuda_graphs="eager")
    for r, (p, n) in cases.items():
        out, reasons, errors = run(eng, {r: (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))})
        if out[r] != refs[r] or errors:
            bad.append((k, r, "tokens"))
    log(f"k={k}: graph steps {eng.stats['graph_steps']}; {stats}")
if stats["paged_rows"] == 0:
    bad.append("no paged rows checked")
finish(not bad, f"{bad[:20]}")
