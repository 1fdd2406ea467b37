"""The DSA indexer's selection past index_topk (32) at long positions (up to 2047), in the real engine:
(1) every selection the engine's indexers make (target layers 0, 1, 4 and the MTP layer; prefill chunks at budgets 512
    and 33, decode rows, MTP verify/draft rows) == the top-32 of an independent float64 scoring of the same queries,
    head weights and cached keys (near-ties — the 32nd and 33rd float64 scores within 1e-6 relative — are counted, not
    failed);
(2) the engine's selected *positions* per (target layer, position) == the model's reference path (one contiguous
    forward over prompt + output, ``indexer_topk`` in one slab) — and the same with the reference's score slabs forced
    down to 16 rows (``reference.INDEXER_SCORE_BYTES``);
(3) tokens == the model's own greedy loop in all settings.
Exit 1 on a set mismatch that is not a near-tie, or a token mismatch."""
import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from glmkernels import reference
from models.glm5 import Indexer

stats = {"rows": 0, "rows_past_topk": 0, "rows_past_1024": 0, "ties": 0, "bad": 0}
bad = []
record: dict | None = None          # (layer, position) -> frozenset of selected positions (target layers only)
orig_select = Indexer.select


def f64_check(q, w, keys_pos_slots, pos, sel_slots, scale, K):
    """keys_pos_slots: slots of positions 0..pos (visible). Returns (ok, tie)."""
    slots, keys = keys_pos_slots
    s = torch.einsum("hd,td->ht", q.double(), keys.double()) * scale
    score = (w.double()[:, None] * torch.relu(s)).sum(0)
    n = score.numel()
    want_k = min(K, n)
    order = score.argsort(descending=True)
    top = set(slots[order[:want_k]].tolist())
    got = set(x for x in sel_slots.tolist() if x >= 0)
    if got == top:
        return True, False
    kth = score[order[want_k - 1]]
    nxt = score[order[want_k]] if n > want_k else None
    tie = nxt is not None and abs(float(kth - nxt)) <= 1e-6 * max(1.0, abs(float(kth)))
    return False, tie


def make_select(layer_name):
    def select(self, q, w, batch, k_cache):
        out = orig_select(self, q, w, batch, k_cache)
        cfg = self.cfg
        scale = cfg.index_head_dim ** -0.5
        for i, (r0, nr) in enumerate(batch.seq_rows):
            if batch.block_table is not None:
                raise RuntimeError("paged batch not expected on CPU eager")
            slots_all = batch.seq_slots[i]
            inv = {int(s): p for p, s in enumerate(slots_all.tolist())}
            keys_all = k_cache[slots_all].float()
            for r in range(r0, r0 + nr):
                pos = int(batch.positions[r])
                stats["rows"] += 1
                stats["rows_past_topk"] += pos >= cfg.index_topk
                stats["rows_past_1024"] += pos >= 1024
                if pos >= cfg.index_topk:
                    ok, tie = f64_check(q[r], w[r], (slots_all[:pos + 1], keys_all[:pos + 1]), pos, out[r], scale,
                                        cfg.index_topk)
                    if not ok:
                        stats["ties" if tie else "bad"] += 1
                        if not tie:
                            bad.append((layer_name, pos))
                if record is not None and layer_name != "mtp":
                    record[(layer_name, pos)] = frozenset(inv[int(s)] for s in out[r].tolist() if s >= 0)
        return out
    return select


def install(model):
    for i, layer in enumerate(model.model.layers):
        att = layer.self_attn
        if att.indexer is not None:
            name = "mtp" if i >= model.config.num_hidden_layers else i
            att.indexer.select = make_select(name).__get__(att.indexer)


eng0, tok = engine()
cases = {"t": (text_prompt(tok, 2000, 21), 40), "r": (prompt_ids(1500, 22), 30)}
refs = {r: ref_greedy(p, n) for r, (p, n) in cases.items()}
model = ref_model()
# reference selections: one contiguous forward over prompt + output[:-1], whole and with 16-row score slabs
ref_sets = {}
for slab_bytes in (reference.INDEXER_SCORE_BYTES, 16 * 16 * 2048 * 4):
    saved = reference.INDEXER_SCORE_BYTES
    reference.INDEXER_SCORE_BYTES = slab_bytes
    install(model)
    for r, (p, n) in cases.items():
        record = {}
        full, margin = full_recompute_check(p, refs[r], model)
        if full != refs[r]:
            bad.append(("ref full != incremental", r, slab_bytes))
        if slab_bytes in ref_sets.get(r, {}):
            pass
        ref_sets.setdefault(r, {})[slab_bytes] = record
    reference.INDEXER_SCORE_BYTES = saved
for r in cases:
    a, b = ref_sets[r].values()
    if a != b:
        bad.append(("slabbed reference != whole", r, sum(a[k] != b[k] for k in a)))
log("reference path:", dict(stats), "slab check done")
for k, budget in ((0, 512), (0, 33), (3, 512)):
    eng, _ = engine(max_model_len=2048, kv_cache_tokens=2048, speculative_tokens=k, max_num_batched_tokens=budget,
                    max_num_seqs=min(budget, 64))
    install(eng.executor.runner.model)
    before = dict(stats)
    for r, (p, n) in cases.items():
        record = {}
        out, reasons, errors = run(eng, {r: (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))})
        if out[r] != refs[r] or errors:
            bad.append((k, budget, r, "tokens"))
        ref = next(iter(ref_sets[r].values()))
        common_keys = [key for key in record if key in ref]
        diff = [key for key in common_keys if record[key] != ref[key]]
        log(f"k={k} budget={budget} {r}: engine selections at {len(record)} (layer, position)s, {len(common_keys)} "
            f"compared with the reference path, {len(diff)} differ {diff[:5]}")
        if diff or len(common_keys) < 3 * (len(p) + n - 1 - 32):
            bad.append((k, budget, r, "sets vs reference", len(diff), len(common_keys)))
    log(f"k={k} budget={budget}: float64 check", {x: stats[x] - before[x] for x in stats})
log("totals", stats)
if stats["bad"]:
    bad.append(("float64 mismatches", stats["bad"]))
finish(not bad, f"{bad[:20]}")
