"""Mutation testing of glmserve's engine core (session 61's review).

Usage: python mutants.py REPO_DIR [--only=ID[,ID...]] [--without-new] [--new-only] [--list]

Each mutant is a one-line source change (an exact string, replaced once) in REPO_DIR; the targeted unit tests run
(``tests/unit/test_mut61_core.py`` first when it exists, unless --without-new), the file is restored. Prints the
table and exits 0 when every non-equivalent mutant is killed, 1 otherwise (2: the unmutated tree fails its tests).
--new-only runs the new tests alone against each mutant (which ones they kill by themselves).
Runs pytest with REPO_DIR/.venv/bin/python when it exists (else this interpreter), PYTHONPATH=REPO_DIR, CPU only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

NEW = "tests/unit/test_mut61_core.py"

# targeted test sets (fast and most relevant first: pytest -x stops at the first failure)
SCHED = ["test_scheduler.py", "test_priority.py", "test_prefix_cache.py", "test_lookahead.py",
         "test_engine_limits.py", "test_scheduler_fuzz.py"]
POOL = ["test_prefix_cache.py", "test_scheduler.py", "test_priority.py", "test_disagg.py", "test_disagg_holds.py",
        "test_scheduler_fuzz.py"]
REQ = ["test_scheduler.py", "test_sampler.py", "test_priority.py", "test_scheduler_fuzz.py"]
SHAPES = ["test_scheduler_shapes.py", "test_engine_limits.py", "test_lookahead.py", "test_group_plumbing.py"]
SAMPLER = ["test_sampler.py", "test_guided.py"]
SPEC = ["test_review60.py", "test_group_plumbing.py"]
ROWMAP = ["test_rowmap.py", "test_comm_device.py"]
CACHE = ["test_batch.py", "test_kv_memory.py", "test_prefix_cache.py", "test_mtp.py", "test_disagg.py"]

S, B, R, H = "scheduler/scheduler.py", "scheduler/block_pool.py", "scheduler/request.py", "scheduler/shapes.py"
P, V, M, C = "workers/sampler.py", "workers/speculative.py", "workers/rowmap.py", "models/cache.py"

# (id, file, old, new, tests, equivalent: None or why the mutant changes no behaviour)
MUTANTS = [
    # ---- scheduler/scheduler.py
    ("S01", S, "return self.config.max_num_seqs - len(self._running) - len(self._waiting)",
     "return self.config.max_num_seqs - len(self._running)", SCHED, None),
    ("S02", S, "sum(max(0, self.pool.blocks_needed(r.num_tokens) - r.hit_blocks)",
     "sum(max(0, self.pool.blocks_needed(r.num_tokens))", SCHED, None),
    ("S04", S, "return sum(max(0, r.num_tokens - r.hit_blocks * bs) for r in self._waiting)",
     "return sum(max(0, r.num_tokens - r.hit_blocks) for r in self._waiting)", SCHED, None),
    ("S05", S, "if len(self._waiting) - leaving >= self.config.max_waiting:",
     "if len(self._waiting) - leaving > self.config.max_waiting:", SCHED, None),
    ("S07", S, "num_blocks = self.pool.blocks_needed(total_len - 1)",
     "num_blocks = self.pool.blocks_needed(total_len)", SCHED, None),
    ("S09", S, "need = self.pool.blocks_needed(head.num_tokens + 1) - len(hits) + self.pool.cost(hits)",
     "need = self.pool.blocks_needed(head.num_tokens) - len(hits) + self.pool.cost(hits)", SCHED, None),
    ("S10", S, "del self._live[req.req_id]\n            self._unkeep(req)",
     "del self._live[req.req_id]", SCHED, None),
    ("S11", S, "if head is not None and (i == len(self._running) or head.rank < self._running[i].rank):",
     "if head is not None and (i == len(self._running) or head.rank <= self._running[i].rank):", SCHED,
     "ranks (priority, arrival) are unique within a scheduler (arrivals numbered by _enqueue), so no waiting "
     "request ranks equal to a running one"),
    ("S12", S, "if num_new + len(drafts) > budget:", "if num_new + len(drafts) >= budget:", SCHED, None),
    ("S13", S, "budget -= len(seq.token_ids)\n", "budget -= len(seq.token_ids) - seq.num_drafts\n", SCHED, None),
    ("S15", S, "lower = [r for r in self._running if req.rank < r.rank]",
     "lower = [r for r in self._running if req.rank <= r.rank]", SCHED, None),
    ("S16", S, "self._chunk_blocks(req, budget) - self.pool.freed_by([r.block_ids for r in lower]))",
     "self._chunk_blocks(req, budget) - sum(len(r.block_ids) for r in lower))", SCHED, None),
    ("S17", S, "room = min(max_drafts, budget - num_new, req.params.max_tokens - len(req.output_ids) - 1,",
     "room = min(max_drafts, budget - num_new, req.params.max_tokens - len(req.output_ids),", SCHED, None),
    ("S19", S, "drafts = drafts[:-1]", "drafts = []", SCHED, None),
    ("S20", S, "req.num_preemptions += 1", "pass", SCHED, None),
    ("S22", S, "pending = max((common_prefix(ids, r.all_ids) - 1) // bs for r in prefilling) - hits",
     "pending = max(common_prefix(ids, r.all_ids) // bs for r in prefilling) - hits", SCHED, None),
    ("S23", S, "prefilling = [r for r in self._running if r.status is RequestStatus.PREFILLING\n"
     "                      and r.params.cache_salt == req.params.cache_salt]",
     "prefilling = [r for r in self._running if r.status is RequestStatus.PREFILLING]", SCHED, None),
    ("S25", S, "self.prefix_hits += start - imported", "self.prefix_hits += start", SCHED, None),
    ("S26", S, "need = self.pool.blocks_needed(seq.end_pos + self.slack) - len(req.block_ids)",
     "need = self.pool.blocks_needed(seq.end_pos + self.slack + 1) - len(req.block_ids)", SCHED, None),
    ("S27", S, "accepted = min(len(tokens) - 1, seq.num_drafts)", "accepted = min(len(tokens), seq.num_drafts)",
     SCHED, None),
    ("S28", S, "full = min(req.num_computed_tokens, req.num_tokens - 1) // bs",
     "full = req.num_computed_tokens // bs", SCHED, None),
    ("S29", S, "node = req.cached_nodes[-1] if req.cached_nodes else root(req.params.cache_salt)",
     "node = root(req.params.cache_salt)", SCHED, None),
    ("S31", S, "keep = self.pool.blocks_needed(req.num_computed_tokens + self.slack)",
     "keep = self.pool.blocks_needed(req.num_computed_tokens)", SCHED, None),
    ("S32", S, "            if tok in stop_ids:\n                return new_ids, FinishReason.STOP\n"
     "            if len(req.output_ids) >= params.max_tokens:\n                return new_ids, FinishReason.LENGTH",
     "            if len(req.output_ids) >= params.max_tokens:\n                return new_ids, FinishReason.LENGTH\n"
     "            if tok in stop_ids:\n                return new_ids, FinishReason.STOP", SCHED, None),
    ("S33", S, "self._running.remove(req)\n        self._unkeep(req)", "self._running.remove(req)", SCHED, None),
    ("S34", S, "for req in self._running:\n            req.cached_nodes = []",
     "for req in self._running:\n            pass", SCHED, None),
    ("B01", B, "b = self._idle.popitem(last=False)[0] if self._idle else self._pop_kept()",
     "b = self._idle.popitem(last=True)[0] if self._idle else self._pop_kept()", POOL, None),
    ("B03", B, "return sum(n == self._refs[b] for b, n in holds.items())", "return len(holds)", POOL, None),
    ("B04", B, "if node is None or self._nodes[node].pending:", "if node is None:", POOL, None),
    ("B05", B, "return sum(n.block is None or self._refs[n.block] == 0 for",
     "return sum(n.block is not None and self._refs[n.block] == 0 for", POOL, None),
    ("B06", B, "if self._idle.pop(b, 0) is None or order < self._kept[b]:",
     "if self._idle.pop(b, 0) is None or order > self._kept[b]:", POOL, None),
    ("B07", B, "self._set_kept(b, min(orders))\n", "self._set_kept(b, max(orders))\n", POOL, None),
    ("B08", B, "if self._pins[n] > 1:", "if self._pins[n] >= 1:", POOL, None),
    ("B09", B, "            if node.block is None:\n                assert block_id not in self._node_of_block",
     "            if False:\n                assert block_id not in self._node_of_block", POOL, None),
    ("B10", B, "slot, _ = self._host_lru.popitem(last=False)", "slot, _ = self._host_lru.popitem(last=True)",
     POOL, None),
    ("R01", R, "return self.prompt_ids[start:end] + self.output_ids[:max(0, end - p)]",
     "return self.prompt_ids[start:end] + self.output_ids[:end - p]", REQ, None),
    ("R02", R, "if start >= p:", "if start > p:", REQ,
     "at start == p the other branch gives prompt_ids[p:end] (empty) + output_ids[:end - p]: the same slice"),
    ("H01", H, "if len(owners) == 1 and rows_wanted[owners[0]] > 1:",
     "if len(owners) == 1 and rows_wanted[owners[0]] >= 1:", SHAPES, None),
    ("H02", H, "granule = max(1, next_pow2(blocks) // (2 * WIDTHS_PER_OCTAVE))",
     "granule = max(1, next_pow2(blocks) // WIDTHS_PER_OCTAVE)", SHAPES, None),
    ("H03", H, "return max(b for b in GRAPH_BUCKETS if b * num_ranks <= GRAPH_MOE_ROWS)",
     "return max(b for b in GRAPH_BUCKETS if b * num_ranks < GRAPH_MOE_ROWS)", SHAPES, None),
    ("H06", H, "chunks = shape.rows_per_rank <= chunk_rows and", "chunks = shape.rows_per_rank < chunk_rows and",
     SHAPES, None),
    ("P01", P, "weights = weights.masked_fill(above >= top_p * weights.sum(dim=-1, keepdim=True), 0.0)",
     "weights = weights.masked_fill(above > top_p * weights.sum(dim=-1, keepdim=True), 0.0)", SAMPLER, None),
    ("P02", P, "above = _cumsum_rows(weights) - weights", "above = _cumsum_rows(weights)", SAMPLER, None),
    ("P04", P, "weights = weights.masked_fill(weights < _row_values([p.min_p for p in params], device), 0.0)",
     "weights = weights.masked_fill(weights <= _row_values([p.min_p for p in params], device), 0.0)", SAMPLER,
     None),
    ("P05", P, "out = torch.where(counts[:, 0] > 0, torch.where(logits > 0, logits / rep, logits * rep), logits)",
     "out = torch.where(counts[:, 1] > 0, torch.where(logits > 0, logits / rep, logits * rep), logits)", SAMPLER,
     None),
    ("P06", P, "if num_generated is not None and num_generated[i] < p.min_tokens",
     "if num_generated is not None and num_generated[i] <= p.min_tokens", SAMPLER, None),
    ("P07", P, "h = (seed * _SEED_MULT + index) & ((1 << 64) - 1)", "h = (seed + index) & ((1 << 64) - 1)",
     SAMPLER, None),
    ("P08", P, "fill_seeded_noise(noise[out_row], params[row].seed, num_generated[row])",
     "fill_seeded_noise(noise[out_row], params[row].seed, num_generated[out_row])", SAMPLER, None),
    ("P09", P, "pick = (weights / noise.gather(1, order)).argmax(dim=-1, keepdim=True)",
     "pick = (weights / noise[:, :order.shape[1]]).argmax(dim=-1, keepdim=True)", SAMPLER, None),
    ("P10", P, "chosen = logp.gather(1, tokens[index][:, None]).squeeze(1)",
     "chosen = logp.gather(1, tokens[:len(rows)][:, None]).squeeze(1)", SAMPLER, None),
    ("P12", P, "return counts[None] + added.cumsum(dim=0, dtype=counts.dtype)[:, None]",
     "return counts[None] + added[:, None]", SAMPLER, None),
    ("V01", V, "tokens = sample(logits, [params] * (k + 1), counts, [num_generated + i for i in range(k + 1)])",
     "tokens = sample(logits, [params] * (k + 1), counts, [num_generated] * (k + 1))", SPEC, None),
    ("V02", V, "accept = (q_d > 0) & (u * q_d < p_d)", "accept = (q_d > 0) & (u * p_d < q_d)", SPEC, None),
    ("V03", V, "residual = (p - draft_probs).clamp(min=0)", "residual = (draft_probs - p).clamp(min=0)", SPEC,
     None),
    ("V04", V, "fixes = _race(residual)[:, 0]", "fixes = _race(p)[:, 0]", SPEC, None),
    ("V05", V, "noise = fill_seeded_noise(torch.empty_like(q), params.seed, num_generated + len(so_far))",
     "noise = fill_seeded_noise(torch.empty_like(q), params.seed, num_generated)", SPEC, None),
    ("M01", M, "return row // m.rows_per_rank", "return row % m.num_ranks", ROWMAP, None),
    ("M02", M, "return range(m.num_rows) if rank == owner else range(0)",
     "return range(m.num_rows) if rank != owner else range(0)", ROWMAP, None),
    ("C01", C, "return blocks[t // block_size] * block_size + t % block_size",
     "return blocks[t // block_size] + t % block_size", CACHE, None),
    ("C02", C, "fewest_keys=int(starts.min()) + 1)", "fewest_keys=int(starts.min()))", CACHE, None),
    ("C03", C, "if self._saving is not None and not self._saving[2].isdisjoint(slots):\n            self.settle()",
     "if False:\n            self.settle()", CACHE, None),
]


def _change(old: str, new: str) -> str:
    """The lines a mutant changes: `- old` / `+ new` (the lines both sides share left out)."""
    a, b = [x.strip() for x in old.splitlines()], [x.strip() for x in new.splitlines()]
    gone, added = [x for x in a if x not in b], [x for x in b if x not in a]
    if not gone and not added:          # the same lines in another order
        return "reordered: " + " | ".join(b)
    return " / ".join([f"- {x}" for x in gone] + [f"+ {x}" for x in added])


def _python(repo: Path) -> str:
    venv = repo / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _run_tests(repo: Path, files: list[str], with_new: bool, timeout: int = 300) -> tuple[str, float]:
    paths = ([NEW] if with_new else []) + [f"tests/unit/{f}" for f in files if f != "NONE"]
    env = dict(os.environ, PYTHONPATH=str(repo), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               CUDA_VISIBLE_DEVICES="")
    cmd = [_python(repo), "-m", "pytest", *paths, "-x", "-q", "-p", "no:cacheprovider"]
    t0 = time.time()
    try:
        rc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.time() - t0
    if rc == 0:
        return "survived", time.time() - t0
    if rc == 1:
        return "killed", time.time() - t0
    return f"error (pytest rc {rc})", time.time() - t0


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    if not args:
        print(__doc__)
        return 2
    repo = Path(args[0]).resolve()
    only = None
    for a in argv:
        if a.startswith("--only="):
            only = set(a.split("=", 1)[1].split(","))
    with_new = (repo / NEW).exists() and "--without-new" not in argv
    mutants = [m for m in MUTANTS if only is None or m[0] in only]
    if "--new-only" in argv:            # the new tests alone (each mutant they kill, they kill by themselves)
        if not with_new:
            print(f"--new-only needs {NEW}")
            return 2
        mutants = [(*m[:4], ["NONE"], m[5]) for m in mutants]
    bad = []
    for mid, path, old, new, _, _ in MUTANTS:
        n = (repo / path).read_text().count(old)
        if n != 1:
            bad.append(f"{mid}: {n} matches in {path}")
    if bad:
        print("mutants that do not apply:\n  " + "\n  ".join(bad))
        return 2
    if "--list" in argv:
        for m in mutants:
            print(m[0], m[1], repr(m[2]), "->", repr(m[3]))
        return 0
    base_files = sorted({f for m in mutants for f in m[4]})
    status, secs = _run_tests(repo, base_files, with_new, timeout=900)
    print(f"baseline (unmutated, {'with' if with_new else 'without'} {NEW}): {status} in {secs:.0f}s", flush=True)
    if status != "survived":
        print("the unmutated tree fails its tests: nothing to measure")
        return 2
    rows, live = [], []
    for mid, path, old, new, files, equivalent in mutants:
        src = repo / path
        text = src.read_text()
        line = text[:text.index(old)].count("\n") + 1
        src.write_text(text.replace(old, new, 1))
        try:
            status, secs = _run_tests(repo, files, with_new)
        finally:
            src.write_text(text)
        verdict = "equivalent" if equivalent else ("killed" if status.startswith("killed") else "LIVE")
        if verdict == "LIVE":
            live.append(mid)
        change = _change(old, new)
        rows.append((mid, f"{path}:{line}", change, status, verdict))
        print(f"{mid:4} {path}:{line:<4} {status:18} {verdict:10} {secs:5.1f}s  {change}", flush=True)
    killed = sum(r[3].startswith("killed") for r in rows)
    equiv = sum(r[4] == "equivalent" for r in rows)
    print(f"\n{len(rows)} mutants: {killed} killed, {len(rows) - killed} survived ({equiv} equivalent); "
          f"non-equivalent survivors: {', '.join(live) or 'none'}")
    return 1 if live else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
