#!/usr/bin/env python
"""Mutation testing of the offline tools that build models/tiny (session 63's review).

    python mutants.py REPO_DIR [--no-new-tests] [--only ID,ID] [--check]

Each mutant is a one-string replace in one of ``tools/corpus.py``, ``tools/train_tokenizer.py``,
``tools/train_tiny.py`` or ``tools/eval_tiny.py`` (asserted to match exactly once) that models a plausible bug: text
normalisation, the extractors, the held-out split and corpus-wide de-duplication; the tokenizer's vocabulary layout,
stop tokens and chat template; the trainer's schedule, initialisation, indexer KL loss, expert balancing, checkpoint,
resume and export; the evaluator's counts and greedy decode. The repository's tracked and untracked, not ignored, files
are copied to a temporary folder (REPO_DIR itself is never changed); for each mutant the file is changed there, the
tests run (``-x``, unit files first: their conftest turns on Triton's interpreter), and the file is restored.

No test imported tools/ before this review, so every mutant runs the same existing tests, those of what the tools make
(``test_tokenizer.py``: models/tiny's tokenizer; ``test_tiny_model.py``: its weights), plus this review's
``tests/unit/test_tools.py`` and ``tests/unit/test_tools_train.py`` unless ``--no-new-tests``. Prints a table; exits
0 when every mutant not marked equivalent is killed, 1 otherwise (2: the unmutated tests fail, or a mutant's text is
not found once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

U = "tests/unit/"
NEW_TESTS = [U + "test_tools.py", U + "test_tools_train.py"]
EXISTING = [U + "test_tokenizer.py", "tests/integration/test_tiny_model.py"]


def M(mid, file, old, new, what, eq=None):
    return {"id": mid, "file": file, "old": old, "new": new, "what": what, "eq": eq}


TC, TK, TT, TE = "tools/corpus.py", "tools/train_tokenizer.py", "tools/train_tiny.py", "tools/eval_tiny.py"

MUTANTS = [
    # ---- tools/corpus.py: normalising --------------------------------------------------------------------------------
    M("C01", TC, 'unicodedata.normalize("NFC", line)', 'unicodedata.normalize("NFD", line)',
      "normalize_line: NFD instead of NFC (é as e + combining accent)"),
    M("C02", TC, 'line = re.sub(r".\\x08", "", line)', 'line = re.sub(r"\\x08", "", line)',
      "overstrike: only the backspace removed (b\\bb -> bb)"),
    M("C03", TC, "    return letters >= 0.6 * len(visible)", "    return letters > 0.6 * len(visible)",
      "is_prose: exactly 60 % letters rejected"),
    M("C04", TC, "        if line.strip():\n            current.append", "        if line:\n            current.append",
      "split_blocks: a whitespace-only line does not end a block"),
    M("C05", TC, "    if current:\n        blocks.append(current)\n    return blocks", "    return blocks",
      "split_blocks: the last block (no blank line after it) dropped"),
    # ---- tools/corpus.py: extractors ---------------------------------------------------------------------------------
    M("C06", TC, 'if path.suffix in (".dat", ".u8")', 'if path.suffix == ".dat"',
      "fortunes: the .u8 twins read too (every cookie twice)"),
    M("C07", TC, 'if word.startswith("00database"):', 'if word == "00database":',
      "devil: 00database* header entries kept"),
    M("C08", TC, "split_blocks(text) if _indent(b[0]) < 8]", "split_blocks(text) if _indent(b[0]) <= 8]",
      "jargon: blocks indented 8 columns (tables, figures) kept"),
    M("C09", TC, '_RST_LINK = re.compile(r"`([^`<]*?)\\s*<[^`>]*>`_{1,2}")',
      '_RST_LINK = re.compile(r"`([^`<]*?)\\s*<[^`>]*>`_")', "reST: anonymous links (`text <url>`__) keep their URL"),
    M("C10", TC, 'text = re.sub(r"(?<![\\w*])\\*(\\S[^*]*?)\\*(?![\\w*])", r"\\1", text)',
      'text = re.sub(r"\\*(\\S[^*]*?)\\*", r"\\1", text)', "reST emphasis: a*b*c loses its stars"),
    M("C11", TC, 'if m.group(1) in ("note", "warning", "seealso", "impl-detail") else ""',
      'if m.group(1) in ("warning", "seealso", "impl-detail") else ""', "reST: a note's lead text dropped"),
    M("C12", TC, "            skip_deeper_than = indent\n            para = para[:-2]", "            para = para[:-2]",
      "reST: the literal block after :: not skipped (code in the corpus)"),
    M("C13", TC, "if not lines or len(block) != len(lines) and len(lines) == 1:", "if not lines:",
      "reST: headings kept as prose"),
    M("C14", TC, '    if code in "XZ":', '    if code in "Z":', "POD: X<index entries> kept in the text"),
    M("C15", TC, 'if first.startswith("=") or first[0] == " ":', 'if first.startswith("="):',
      "POD: verbatim (code) paragraphs kept"),
    M("C16", TC, 'in_begin = not first.startswith("=end")', "in_begin = False",
      "POD: a =begin block skipped for one paragraph only"),
    M("C17", TC, r're.fullmatch(r"[1-3]?\s?[A-Z][A-Za-z ]+ \d+", line.strip())',
      r're.fullmatch(r"[A-Z][A-Za-z ]+ \d+", line.strip())', "bible: numbered books (1 John) not chapter headings"),
    M("C18", TC, 'verses[-1] = normalize_line(verses[-1] + " " + line)', "verses.append(normalize_line(line))",
      "bible: a verse's continuation line made a verse of its own"),
    # ---- tools/corpus.py: split, de-duplication, build, fetch -------------------------------------------------------
    M("C19", TC, "held = is_heldout(source.name, doc_id, heldout_fraction)",
      "held = is_heldout(source.packages[0], doc_id, heldout_fraction)",
      "build: split keyed by the package name (the module docstring's wording), not the source's"),
    M("C20", TC, '            stats = {"docs": 0,', '            seen = set()\n            stats = {"docs": 0,',
      "build: duplicates dropped within a source only"),
    M("C21", TC, 'data = block + "\\n\\n"', 'data = block + "\\n"', "build: blocks not separated by a blank line"),
    M("C22", TC, "for extra in roots[1:]:", "for extra in roots[2:]:", "build: a source's second package not merged"),
    M("C23", TC, '["dpkg-deb", "-x", str(deb), str(root)]', '["dpkg-deb", "-e", str(deb), str(root)]',
      "fetch: only the control files unpacked"),
    # ---- tools/train_tokenizer.py ------------------------------------------------------------------------------------
    M("K01", TK, '    "<|user|>",\n    "<|assistant|>",\n', '    "<|assistant|>",\n    "<|user|>",\n',
      "special tokens out of GLM's order (<|user|> 8, <|assistant|> 7)"),
    M("K02", TK, 'STOP_TOKENS = ("<|user|>", "<|observation|>")', 'STOP_TOKENS = ("<|user|>",)',
      "a tool call's turn end (<|observation|>) not a stop token"),
    M("K03", TK, "        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),\n", "",
      "bytes absent from the corpus get no symbol"),
    M("K04", TK, "min_frequency=2,", "min_frequency=1,", "pairs seen once merged"),
    M("K05", TK, "ByteLevel(add_prefix_space=False)", "ByteLevel(add_prefix_space=True)",
      "a space prefixed to every text"),
    M("K06", TK, "{%- if loop.index0 > ns.last_user_index and reasoning.strip() -%}",
      "{%- if reasoning.strip() -%}", "template: reasoning of turns before the last user message kept"),
    M("K07", TK, "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}", "{%- if true -%}",
      "template: <|observation|> before every tool result, not once per run of them"),
    M("K08", TK, "('</think>' if enable_thinking is defined and not enable_thinking else '<think>')",
      "('<think>' if enable_thinking is defined and not enable_thinking else '</think>')",
      "template: generation prompt's thinking switch reversed"),
    # ---- tools/train_tiny.py: schedule, data, init -------------------------------------------------------------------
    M("T01", TT, "warm = min(1.0, (step + 1) / args.warmup_steps)", "warm = min(1.0, step / args.warmup_steps)",
      "lr warm-up starts at 0 (the first step does nothing)"),
    M("T02", TT, "(0.1 + 0.9 * 0.5 * (1 + math.cos(", "(0.5 * (1 + math.cos(", "lr cosine decays to 0, not 10 %"),
    M("T03", TT, "math.cos(math.pi * min(progress, 1.0))", "math.cos(math.pi * progress)",
      "lr past the budget (a resume with a smaller --minutes) rises again"),
    M("T04", TT, "out_std = 0.02 / math.sqrt(2 * model.config.num_cache_layers)",
      "out_std = 0.02 / math.sqrt(2 * model.config.num_hidden_layers)", "residual init scale ignores the MTP layer"),
    M("T05", TT, "    for layer in model.model.layers:\n        if layer.self_attn.indexer",
      "    for layer in model.target_layers:\n        if layer.self_attn.indexer",
      "set_index_topk skips the MTP layer's indexer"),
    # ---- tools/train_tiny.py: the indexer KL -------------------------------------------------------------------------
    M("T06", TT, "self.owner[layer] = layer if cfg.has_indexer(layer) else self.owner[layer - 1]",
      "self.owner[layer] = layer if cfg.has_indexer(layer) else layer - 1",
      "owner of a shared layer = the layer before (wrong after two shared layers)"),
    M("T07", TT, "self.targets.setdefault(self.owner[layer], [])", "self.targets.setdefault(layer, [])",
      "an indexer's target is its own layer only (not the shared layers using its selection)"),
    M("T08", TT, "w_uk = attn.kv_b_proj.weight.view(nh, dn + cfg.v_head_dim, rkv)[:, :dn]",
      "w_uk = attn.kv_b_proj.weight.view(nh, dn + cfg.v_head_dim, rkv)[:, dn:]", "dense target: W_UV used as W_UK"),
    M("T09", TT, "q_rope = rope.apply(q[..., dn:], cfg.rope_interleave)",
      "q_rope = rope.apply(q[..., dn:], cfg.indexer_rope_interleave)",
      "dense target: q roped with the indexer's convention"),
    M("T10", TT, "target = torch.stack(self.targets[layer]).mean(0)", "target = self.targets[layer][0]",
      "KL target: the owner's layer only"),
    M("T11", TT, "total = total + kl.sum() / (B * S)", "total = total + kl.sum() / B", "KL: sum over rows, not mean"),
    M("T12", TT, "k = rope.apply(ix.k_norm(ix.wk(h)), cfg.indexer_rope_interleave)", "k = ix.k_norm(ix.wk(h))",
      "indexer scores: keys not roped"),
    M("T13", TT, "q = rope.apply(ix.wq_b(q_resid).view(B * S, cfg.index_n_heads, -1), cfg.indexer_rope_interleave)",
      "q = rope.apply(ix.wq_b(q_resid).view(B * S, cfg.index_n_heads, -1), cfg.rope_interleave)",
      "indexer scores: queries roped with MLA's convention"),
    # ---- tools/train_tiny.py: expert balancing -----------------------------------------------------------------------
    M("T14", TT, "rate * torch.sign(load.mean() - load)", "rate * torch.sign(load - load.mean())",
      "bias moves away from balance"),
    M("T15", TT, "                load.zero_()\n", "", "loads accumulate over steps (the bias chases the run's total)"),
    M("T16", TT, "        if torch.is_grad_enabled():\n            self.loads",
      "        if True:\n            self.loads",
      "no_grad forwards (evaluations) counted as load"),
    # ---- tools/train_tiny.py: losses, optimizer, the loop, checkpoints, export ---------------------------------------
    M("T17", TT, "mtp = F.cross_entropy(model.logits(mtp_hidden), windows[:, 2:S + 2].reshape(-1))",
      "mtp = F.cross_entropy(model.logits(mtp_hidden), windows[:, 1:S + 1].reshape(-1))",
      "MTP loss on t_{p+1} (the token it is fed)"),
    M("T18", TT, "set_index_topk(model, args.seq_len if dense else cfg.index_topk)",
      "set_index_topk(model, cfg.index_topk if dense else args.seq_len)", "dense and sparse phases swapped"),
    M("T19", TT, '        for g in opt.param_groups:\n            g["lr"] = lr',
      '        opt.param_groups[0]["lr"] = lr',
      "schedule applied to the decayed group only (norms stay at --lr)"),
    M("T20", TT, 'loss = parts["lm"] + args.mtp_weight * parts["mtp"] + parts["kl"]',
      'loss = parts["lm"] + args.mtp_weight * parts["mtp"]', "indexer KL left out of the loss (indexers never train)"),
    M("T21", TT, "imbalance = balancer.update(args.bias_rate)", "imbalance = balancer.update(0.0)",
      "--bias-rate ignored"),
    M("T22", TT, "if step % args.ckpt_every == 0 or elapsed >= budget:", "if step % args.ckpt_every == 0:",
      "no checkpoint when the budget runs out between --ckpt-every steps"),
    M("T23", TT, '        step, elapsed, seen = state["step"], state["elapsed"], state["tokens"]',
      '        step, elapsed, seen = state["step"], 0.0, state["tokens"]', "resume restarts the time budget"),
    M("T24", TT, '        gen.set_state(state["sampler_rng"])\n', "", "resume re-draws the first windows"),
    M("T25", TT, '        opt.load_state_dict(state["optimizer"])\n', "", "resume with a fresh optimizer"),
    M("T26", TT, 'state_dict=checkpoint_state_dict(model), dtype="bfloat16")',
      'state_dict=model.state_dict(), dtype="bfloat16")',
      "export with stacked experts (not the checkpoint layout)"),
    # ---- tools/eval_tiny.py ------------------------------------------------------------------------------------------
    M("E01", TE, 'ce = F.cross_entropy(logits, windows[:, 1:S + 1].reshape(-1), reduction="sum")',
      'ce = F.cross_entropy(logits, windows[:, :S].reshape(-1), reduction="sum")', "perplexity of the input token"),
    M("E02", TE, '"agree": (mtp_next2[:, :-1] == main_next[:, 1:]).sum().item()',
      '"agree": (mtp_next2[:, :-1] == main_next[:, :-1]).sum().item()',
      "MTP agreement against the main head's t_{p+1}, not t_{p+2}"),
    M("E03", TE, '"mtp_hit": (mtp_next2[:, :-1] == windows[:, 2:S + 1]).sum().item()',
      '"mtp_hit": (mtp_next2[:, :-1] == windows[:, 1:S]).sum().item()', "MTP accuracy against t_{p+1}"),
    M("E04", TE, "for i in range(0, num_windows, batch_size):", "for i in range(0, num_windows - 1, batch_size):",
      "the last batch of windows dropped"),
    M("E05", TE, "score_windows(model, windows[i:i + batch_size], kv_fp8)",
      "score_windows(model, windows[i:i + batch_size])",
      "--kv-cache-dtype fp8 ignored"),
    M("E06", TE, "        pos += len(step_ids)\n", "        pos += 1\n",
      "greedy decode: positions after the prompt wrong"),
    M("E07", TE, "        out.append(nxt)\n        step_ids = [nxt]\n        if nxt in stop_ids:\n            break\n",
      "        if nxt in stop_ids:\n            break\n        out.append(nxt)\n        step_ids = [nxt]\n",
      "greedy decode: the stop token left out"),
    M("E08", TE, "    set_index_topk(model, args.seq_len)\n", "    set_index_topk(model, cfg.index_topk)\n",
      "'dense' perplexity run sparse"),
    M("E09", TE, "    set_index_topk(model, cfg.index_topk)\n    print(", "    print(",
      "the greedy sample decoded with dense attention (the sparse top-k not restored)"),
]


def copy_repo(repo: Path, dest: Path) -> None:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = repo / rel
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def run_tests(work: Path, python: str, tests: list[str], timeout: int = 300) -> tuple[str, float, str]:
    env = {**os.environ, "PYTHONPATH": str(work), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.time()
    try:
        p = subprocess.run([python, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "killed(timeout)", time.time() - t0, ""
    tail = (p.stdout + p.stderr).strip().splitlines()
    last = tail[-1] if tail else ""
    if p.returncode == 0:
        return "survived", time.time() - t0, last
    if p.returncode in (1, 2, 3):
        failed = next((ln for ln in tail if ln.startswith(("FAILED", "ERROR"))), last)
        return "killed", time.time() - t0, failed
    return f"error(rc={p.returncode})", time.time() - t0, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("--no-new-tests", action="store_true", help=f"do not run {', '.join(NEW_TESTS)}")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--check", action="store_true", help="only check that every mutant's text matches once")
    a = ap.parse_args()
    repo = a.repo.resolve()
    python = str(repo / ".venv/bin/python") if (repo / ".venv/bin/python").exists() else sys.executable
    chosen = [m for m in MUTANTS if not a.only or m["id"] in a.only.split(",")]
    bad = [(m["id"], (repo / m["file"]).read_text().count(m["old"])) for m in chosen]
    bad = [b for b in bad if b[1] != 1]
    if bad:
        print(f"mutant text not found exactly once: {bad}")
        return 2
    if a.check:
        print(f"{len(chosen)} mutants, each matching once")
        return 0
    with tempfile.TemporaryDirectory(prefix="mut63-") as tmp:
        work = Path(tmp)
        copy_repo(repo, work)
        new = [t for t in NEW_TESTS if (work / t).exists()] if not a.no_new_tests else []
        tests = new + EXISTING                          # unit files first (Triton's interpreter), the new ones first
        status, dt, last = run_tests(work, python, tests, timeout=600)
        print(f"unmutated: {status} in {dt:.0f} s ({last})", flush=True)
        if status != "survived":
            return 2
        rows = []
        for m in chosen:
            path = work / m["file"]
            original = path.read_text()
            path.write_text(original.replace(m["old"], m["new"], 1))
            try:
                status, dt, last = run_tests(work, python, tests)
            finally:
                path.write_text(original)
            rows.append((m, status))
            print(f"{m['id']:4} {status:15} {dt:5.0f} s  {m['file']}: {m['what']}"
                  + (f"  [equivalent: {m['eq']}]" if m["eq"] else "")
                  + (f"  <- {last}" if status != "survived" else ""),
                  flush=True)
    live = [m["id"] for m, s in rows if not m["eq"] and not s.startswith("killed")]
    eq = [m["id"] for m, _ in rows if m["eq"]]
    killed = sum(1 for m, s in rows if not m["eq"] and s.startswith("killed"))
    print(f"\n{len(rows)} mutants ({len(eq)} equivalent: {', '.join(eq) or '-'}); {killed} of {len(rows) - len(eq)} "
          f"non-equivalent killed; surviving: {', '.join(live) or 'none'}")
    return 1 if live else 0


if __name__ == "__main__":
    sys.exit(main())
