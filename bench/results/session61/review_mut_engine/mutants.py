"""Mutation testing of glmserve's engine loop (session 61 review): cluster/engine.py, cluster/async_engine.py,
cluster/local.py, workers/runner.py, workers/graphs.py, workers/pieces.py.

    python mutants.py REPO_DIR [--without-new] [--only ID,ID] [--new-only]

Applies each mutant (a one-place string replace, checked to match exactly once) to REPO_DIR's source, runs the
targeted tests (plus tests/integration/test_mut61_engine.py unless --without-new), restores the file, and prints the
table. Exit 0 when every non-equivalent mutant is killed, 1 otherwise. ``--new-only``: the new tests alone (to check
which mutants they kill). Run it with the project's interpreter: it runs pytest with ``sys.executable``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

NEW = "tests/integration/test_mut61_engine.py"
U = ["tests/unit/test_lookahead.py", "tests/unit/test_group_faults.py", "tests/unit/test_engine_limits.py"]
TE = "tests/integration/test_engine.py"
TG = "tests/integration/test_graphs.py"
TS = "tests/integration/test_speculative.py"
GD = "tests/unit/test_generation_defaults.py"
E, A, L = "cluster/engine.py", "cluster/async_engine.py", "cluster/local.py"
R, G, P = "workers/runner.py", "workers/graphs.py", "workers/pieces.py"

# (id, file, old, new, tests (paths, optionally "path::-k expr"), why equivalent or None)
MUTANTS = [
    ("E01", E, "s.start_pos != r.start_pos + 1", "s.start_pos != r.start_pos", U, None),
    ("E02", E, "return graph == key and all(", "return all(", U, None),
    ("E03", E, "or len(s.token_ids) != 1 or s.num_drafts:", "or s.num_drafts:", U + [f"{TG}::-k lookahead"], None),
    ("E04", E, "s.end_pos + 1 > len(s.block_ids) * bs", "s.end_pos > len(s.block_ids) * bs",
     U + [f"{TG}::-k lookahead"], None),
    ("E05", E, "goes_on |= s.num_generated + 1 < params.max_tokens", "goes_on |= s.num_generated < params.max_tokens",
     U, None),
    ("E06", E, "s.end_pos + 1 < self.config.max_model_len", "s.end_pos < self.config.max_model_len", U, None),
    ("E07", E, "or any(not r.importing for sch in self.schedulers for r in sch.waiting())",
     "or any(False for sch in self.schedulers for r in sch.waiting())", U, None),
    ("E08", E, "graph is not None and self.speculative_tokens == 0)", "graph is not None)", U, None),
    ("E09", E, "if not s.sample or len(s.token_ids) != 1 or", "if len(s.token_ids) != 1 or",
     U + [f"{TG}::-k lookahead"], None),
    ("E10", E, "r.params.max_tokens - len(r.output_ids) > 2", "r.params.max_tokens - len(r.output_ids) > 1",
     [TS], None),
    ("E11", E, "if self.prompts_only:\n            return False\n        live", "live", [TS, TG + "::-k prompts_only"],
     None),
    ("E12", E, 'self.stats["preemptions"] += sum(len(p.preempted) for p in plans)', "pass", U + [f"{TE}::-k preempt"],
     None),
    ("E13", E, "if all(p.is_empty for p in plans) and not any(forget) and",
     "if all(p.is_empty for p in plans) and", [f"{TE}::-k abort"], None),
    ("E14", E, "chunk_rows = self._chunk_rows if self.graph_prefill and num_drafts == 0 else 0",
     "chunk_rows = self._chunk_rows if self.graph_prefill else 0", [f"{TG}::-k 'prompt_chunks or graph_key'", TS],
     None),
    ("E15", E, "graph_key(shape, plans, chunk_rows) if self.graphs and not self.prompts_only else None",
     "graph_key(shape, plans, chunk_rows) if self.graphs else None", [f"{TG}::-k prompts_only"], None),
    ("E16", E, "st.num_output += len(tok)", "st.num_output += len(tok) + (len(tok) > 0 and st.num_output == 0)",
     [f"{TE}::-k stop_string", TS + "::-k stop_string"], None),
    ("E17", E, 'self.stats["generated_tokens"] += len(tok)', 'self.stats["generated_tokens"] += len(ids)',
     [TS + "::-k stop_string"], None),
    ("E18", E, "FinishReason.STOP if stopped else ev.finish_reason", "ev.finish_reason", [f"{TE}::-k stop_string"],
     None),
    ("E19", E, "if not ev.finished:\n                    self.schedulers[self._rank_of[ev.req_id]].finish(",
     "if False:\n                    self.schedulers[self._rank_of[ev.req_id]].finish(", [f"{TE}::-k stop_string"], None),
    ("E20", E, "stop_token = last and ev.finish_reason == FinishReason.STOP and bool(tok)",
     "stop_token = last and bool(tok)", [f"{TE}::-k stop"], None),
    ("E21", E, "tok[0] if stop_token and tok[0] in st.stop_ids else None", "tok[0] if stop_token else None",
     [f"{TE}::-k stop"], None),
    ("E22", E, "out.logprobs += lps[i:i + 1]", "out.logprobs += lps[:1]", [TS, f"{TE}::-k logprob"], None),
    ("E23", E, "if not events or tok[0] in self.special_ids:", "if not events:", [f"{TE}::-k reasoning"], None),
    ("E24", E, "events[0].prompt_logprobs, st.prompt_lps = st.prompt_lps, None",
     "events[-1].prompt_logprobs, st.prompt_lps = st.prompt_lps, None", ["tests/integration/test_prompt_logprobs.py"],
     None),
    ("E25", E, "            TokenEvent(ev.req_id, [], \"\", True, ev.finish_reason, ev.error)\n        self._close(ev.req_id)",
     "            TokenEvent(ev.req_id, [], \"\", True, ev.finish_reason, ev.error)", U + [f"{TE}::-k abort"], None),
    ("E26", E, "if self._unsent.pop(req_id, None) is None:\n            self._forget[rank].append(req_id)",
     "self._unsent.pop(req_id, None)", [f"{TE}::-k abort"], None),
    ("E27", E, "for ev in sch.fail([i for i in ids if self._rank_of.get(i) == r],",
     "for ev in sch.fail([i for i in ids if self._rank_of.get(i) == 0],", U, None),
    ("E28", E, "                for sch in self.schedulers:      # what the failed step wrote is unknown: no prefix is "
     "trusted\n                    sch.clear_prefix_cache()\n", "", U, None),
    ("E29", E, "        if steps[0].lookahead:         # the workers launched the next step ahead\n"
     "            self._launched = (steps[0].graph, plans)",
     "        if True:\n            self._launched = (steps[0].graph, plans)", U + [f"{TG}::-k lookahead"], None),
    ("E30", E, "if ev.req_id in self._streams\n", "\n", [f"{TE}::-k 'abort or async'"], None),
    ("E31", E, "if restart and not r.output_ids and not r.importing", "if restart and not r.importing", U, None),
    ("E32", E, "        events = self._fail_live(msg, restart=True)\n        self.rebuild_at = time.monotonic()",
     "        events = self._fail_live(msg, restart=True)", U, None),
    ("E33", E, "min(60.0, 2.0 ** (self._failed_rebuilds - 1))", "min(60.0, 2.0 ** self._failed_rebuilds)", U, None),
    ("E34", E, "return refused + (self._recover() if time.monotonic() >= self.rebuild_at else [])",
     "return self._recover() if time.monotonic() >= self.rebuild_at else []", U, None),
    ("E35", E, "accepted = len(res.sampled[s.req_id]) - 1", "accepted = len(res.sampled[s.req_id])", [TS], None),
    ("E36", E, "or any(self._forget) or bool(self._refused) or", "or any(self._forget) or",
     U + ["tests/unit/test_priority.py"], None),
    ("E37", E, "k = self.speculative_tokens if solo else 0", "k = self.speculative_tokens", [TS], None),
    ("E38", E, "and self.rebuild_at is None else []", "else []", U, None),
    ("A01", A, "        if ev.finished:\n            self._queues.pop(ev.req_id, None)\n", "",
     [f"{TE}::-k async", "tests/unit/test_group_faults.py"], None),
    ("A02", A, "                self._queues.pop(req_id, None)\n                self.engine.abort(req_id)",
     "                self._queues.pop(req_id, None)", [f"{TE}::-k async"], None),
    ("A03", A, 'events = self.engine._fail_all(f"engine error: {type(e).__name__}: {e}")', "events = []",
     ["tests/unit/test_group_faults.py"], None),
    ("A04", A, "                if ev.refused is not None:          # refused to make way for a higher priority: as "
     "if at admission\n                    raise ev.refused\n", "", ["tests/unit/test_priority.py",
                                                                    "tests/unit/test_group_faults.py"], None),
    ("A05", A, "        ev = self.engine.abort(req_id)\n        if ev:\n            self._deliver(ev)",
     "        self.engine.abort(req_id)", [f"{TE}::-k async", "tests/unit/test_group_faults.py"], None),
    ("A06", A, "if time.monotonic() - busy > PROBE_S:", "if False:", ["tests/unit/test_group_faults.py"], None),
    ("A07", A, "        elif not self.is_alive():\n", "        elif False:\n", ["tests/unit/test_group_faults.py"], None),
    ("L01", L, "cfg.max_model_len or min(model_config.max_position_embeddings, num_blocks * cfg.block_size)",
     "cfg.max_model_len or max(model_config.max_position_embeddings, num_blocks * cfg.block_size)",
     ["tests/unit/test_config.py", GD], None),
    ("L02", L, "eos = set(model_config.eos_token_ids) | set(tokenizer.eos_token_ids if tokenizer else ())",
     "eos = set(model_config.eos_token_ids)", ["tests/unit/test_config.py", GD], None),
    ("L03", L, "if v is None or v == _HF_GENERATION[key]:", "if v is None:", [GD], None),
    ("L04", L, '"top_p": lambda v: 0 < v <= 1', '"top_p": lambda v: 0 <= v <= 1', [GD], None),
    ("R01", R, "        for rid in step.finished:          # first: a finished id may come back as a new request\n"
     "            self.requests.pop(rid, None)\n", "", [f"{TE}::-k abort"], None),
    ("R02", R, "[*nr.prompt_ids, *nr.output_ids]", "[*nr.prompt_ids]", [f"{TE}::-k preempt"], None),
    ("R03", R, "if -1 in rows or rows != sorted(rows):", "if -1 in rows:", [f"{TG}::-k lookahead"], None),
    ("R04", R, "                    or s.token_ids != (requests[s.req_id].history[-1],):",
     "                    or False:", [f"{TG}::-k lookahead"], None),
    ("R05", R, "            if len(rows) < len(ahead.seqs):            # requests ended since it was launched: their "
     "rows go\n                tokens = tokens", "            if False:\n                tokens = tokens",
     [f"{TG}::-k lookahead"], None),
    ("R06", R, "num_generated=s.num_generated + 1)", "num_generated=s.num_generated)", [f"{TG}::-k lookahead"], None),
    ("R07", R, "last = [batch.seq_rows[i][0] + batch.seq_rows[i][1] - 1 for i in plain]",
     "last = [batch.seq_rows[i][0] for i in plain]", [f"{TE}::-k concurrent"], None),
    ("R08", R, "s.num_generated == 0 and s.start_pos + 1 < st.num_prompt",
     "s.num_generated == 0 and s.start_pos + 1 <= st.num_prompt", ["tests/integration/test_prompt_logprobs.py"], None),
    ("R09", R, "return r0 + n - 1 - s.num_drafts + len(tokens) - 1", "return r0 + n - 1 - s.num_drafts + len(tokens)",
     [TS], None),
    ("R10", R, "if self.graphs is not None and step.graph is not None and (step.lookahead or step.use_ahead):",
     "if self.graphs is not None and step.graph is not None and step.lookahead:", [f"{TG}::-k lookahead"], None),
    ("R11", R, "                st.counts.add(fed[i:i + 1])            # in place", "                pass  # ",
     [f"{TG}::-k penalties"], None),
    ("R12", R, "        self.requests.clear()\n        self._ahead = None\n", "        self.requests.clear()\n",
     ["tests/unit/test_group_faults.py", f"{TG}::-k lookahead"], None),
    ("R13", R, "        st.history += tokens\n        st.draft_probs = None\n", "        st.history += tokens\n",
     [TS], None),
    ("G01", G, "meta[:, :bucket] = ((0,), (0,), (self.pad_slot,))", "meta[:, :bucket] = ((0,), (0,), (0,))",
     [f"{TG}::-k 'static or lookahead'"], None),
    ("G02", G, "            table[n + 1: n + rows] = table[n]\n", "", [TG + "::-k 'verify or prompt_chunks'"], None),
    ("G03", G, "chain[1] = self.graphs.pad_slot", "chain[1] = 0", [TG + "::-k draft"], None),
    ("P01", P, "        self._meta[:, n:T].copy_(self._pad.expand(3, T - n))\n", "", [TG + "::-k pieces"], None),
    ("P02", P, "topk = self._layer(layer, i, batch, T, i == 0, None if cfg.has_indexer(i) else topk)",
     "topk = self._layer(layer, i, batch, T, i == 1, None if cfg.has_indexer(i) else topk)", [TG + "::-k pieces"],
     None),
    ("P03", P, "        if n <= b:\n            return b", "        if n < b:\n            return b",
     [TG + "::-k pieces"], None),
]


# why a surviving mutant is equivalent (no test can tell it from the original)
EQUIV = {
    'E03': 'a row one position on in a decode plan is one token: a prompt chunk or recompute never follows '
           'a launched row at start_pos + 1 (drafts are checked beside it)',
    'E06': 'implied: admission holds prompt + max_tokens <= max_model_len, so num_generated + 1 < '
           'max_tokens gives end_pos + 1 < max_model_len',
    'E24': 'the step that completes a prompt samples one token (no drafts ride a prompt chunk): it makes '
           'one event',
    'E30': 'Scheduler.update emits nothing for a request aborted while its step ran (checked with an '
           'executor that aborts mid-step): the filter is defensive',
    'R03': "the engine's _advanced walks the launched rows in order (one iterator), so use_ahead never "
           'comes with reordered rows',
    'R04': "the launched step was fed the tokens it sampled, which are the history's last by construction",
    'R08': "a chunk at the prompt's last position yields an empty list, which add_prompt_logprobs appends "
           'as nothing',
    'R12': "every execute takes _ahead out first, and after a failure the engine's next step has use_ahead "
           'False (_launched was cleared before the failed step): the stale launch is dropped at the next '
           'step',
    'R13': 'draft_probs is rewritten by the proposal that precedes every verify round (eager _draft, greedy '
           'and drawn _draft_static); a verify never reads one left from an earlier round',
}


def run_tests(repo: Path, tests: list[str], new: bool) -> bool:
    """True when the tests fail (the mutant is killed)."""
    groups: list[tuple[list[str], str | None]] = []
    if "--new-only" in sys.argv:
        tests = []
    if new and (repo / NEW).exists():          # first: most of its tests take a second
        groups.append(([NEW], None))
    plain = [t for t in tests if "::-k" not in t]
    if plain:
        groups.append((plain, None))
    for t in tests:
        if "::-k" in t:
            path, expr = t.split("::-k ")
            groups.append(([path], expr.strip("'")))
    env = dict(os.environ, PYTHONPATH=str(repo), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    for paths, expr in groups:
        cmd = ["timeout", "300", sys.executable, "-m", "pytest", *paths, "-x", "-q", "-p", "no:cacheprovider"]
        if expr:
            cmd += ["-k", expr]
        r = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        if r.returncode not in (0, 5):      # 5: no test selected
            return True
    return False


def main() -> int:
    repo = Path(sys.argv[1]).resolve()
    new = "--without-new" not in sys.argv
    only = None
    if "--only" in sys.argv:
        only = set(sys.argv[sys.argv.index("--only") + 1].split(","))
    rows, survived = [], []
    for mid, f, old, new_text, tests, _ in MUTANTS:
        equiv = EQUIV.get(mid)
        if only and mid not in only:
            continue
        path = repo / f
        src = path.read_text()
        assert src.count(old) == 1, f"{mid}: {f} holds the original text {src.count(old)} times"
        t0 = time.time()
        try:
            path.write_text(src.replace(old, new_text))
            killed = run_tests(repo, tests, new)
        finally:
            path.write_text(src)
        verdict = "killed" if killed else ("equivalent" if equiv else "SURVIVED")
        if verdict == "SURVIVED":
            survived.append(mid)
        rows.append((mid, f, verdict, time.time() - t0))
        print(f"{mid:5} {f:24} {verdict:10} {time.time() - t0:6.1f}s", flush=True)
    print(f"\n{len(rows)} mutants: {sum(r[2] == 'killed' for r in rows)} killed, "
          f"{sum(r[2] == 'equivalent' for r in rows)} equivalent, {len(survived)} survived {survived}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
