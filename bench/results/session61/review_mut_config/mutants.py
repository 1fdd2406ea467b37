#!/usr/bin/env python
"""Mutation testing of glmserve's configuration and loading side (session 61's review).

    python mutants.py REPO_DIR [--no-new-tests] [--only ID,ID] [--check]

Each mutant is a one-string replace in one source file (asserted to match exactly once) that models a plausible bug.
The repository's tracked and untracked, not ignored, files are copied to a temporary folder (REPO_DIR itself is never
changed); for each mutant the file is changed there, the mutant's targeted unit tests run (``-x``), and the file is
restored. ``tests/unit/test_mut61_config.py`` (this review's tests) is run with every mutant when it exists, unless
``--no-new-tests``. Prints a table; exits 0 when every mutant not marked equivalent is killed, 1 otherwise (2: the
unmutated tests fail, or a mutant's text is not found once).
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

NEW_TESTS = "tests/unit/test_mut61_config.py"
U = "tests/unit/"
CFG = [U + "test_config.py"]
LOAD = [U + "test_loader_errors.py", U + "test_loader_shards.py", U + "test_dummy_load.py", U + "test_review60.py"]
CKPT = [U + "test_loader_errors.py", U + "test_loader_shards.py", U + "test_fp8.py"]
TOK = [U + "test_tokenizer.py", U + "test_chat_messages.py"]
ENG = [U + "test_group_plumbing.py", U + "test_kv_memory.py", U + "test_review59.py", U + "test_review60.py",
       U + "test_disagg.py::test_prefill_settings_name_the_field_in_error"]
MEM = [U + "test_kv_memory.py"]
CLI = [U + "test_group_plumbing.py", U + "test_kv_memory.py", U + "test_dummy_load.py"]
PLAN = [U + "test_disagg.py::test_prefill_settings_name_the_field_in_error", U + "test_review60.py",
        U + "test_review59.py"]


def M(mid, file, old, new, tests, what, eq=None):
    return {"id": mid, "file": file, "old": old, "new": new, "tests": tests, "what": what, "eq": eq}


MC, ML, MK, MT = "models/config.py", "models/loader.py", "models/checkpoint.py", "models/tokenizer.py"
EC, WM, CL, DG = "cluster/config.py", "workers/memory.py", "cluster/cli.py", "cluster/disagg.py"

MUTANTS = [
    # ---- models/config.py ------------------------------------------------------------------------------------------
    M("C01", MC, '"index_head_dim", "index_topk",\n)', '"index_head_dim",\n)', CFG,
      "index_topk dropped from the required fields (a missing one is a TypeError, not a named ConfigError)"),
    M("C01b", MC, "    for key in _REQUIRED:\n", "    for key in _REQUIRED[:-1]:\n", CFG,
      "the required-field check skips index_topk (a KeyError, not a named ConfigError)"),
    M("C02", MC, "    if v < minimum:", "    if v <= minimum:", CFG, "_get_int bound: < minimum -> <= minimum"),
    M("C03", MC, "    if isinstance(v, bool) or not isinstance(v, int):", "    if not isinstance(v, int):", CFG,
      "_get_int accepts a boolean (true -> 1)"),
    M("C04", MC, 'minimum=0 if key in ("first_k_dense_replace", "n_shared_experts") else 1',
      'minimum=0 if key in ("n_shared_experts",) else 1', CFG, "first_k_dense_replace: 0 (no dense layer) refused"),
    M("C05", MC, "int | float) or d[key] <= 0:", "int | float) or d[key] < 0:", CFG,
      "routed_scaling_factor / rms_norm_eps: 0 accepted (<= 0 -> < 0)"),
    M("C06", MC, 'd.get("rope_theta") or 10000.0))', 'd.get("rope_theta") or 1000000.0))', CFG,
      "rope_theta default 10000 -> 1e6 (config without any theta)"),
    M("C07", MC, "max_positions)),", "4096)),", CFG,
      "YaRN original_max_position_embeddings default: max_position_embeddings -> 4096"),
    M("C08", MC, 'beta_fast=number("beta_fast", 32.0) or 32.0, beta_slow=number("beta_slow", 1.0) or 1.0',
      'beta_fast=number("beta_fast", 1.0) or 1.0, beta_slow=number("beta_slow", 32.0) or 32.0', CFG,
      "YaRN beta_fast / beta_slow defaults swapped"),
    M("C09", MC, "low, high = math.floor(low), math.ceil(high)", "low, high = math.ceil(low), math.floor(high)", CFG,
      "YaRN ramp truncation: floor/ceil swapped"),
    M("C10", MC, "(rotations * 2 * math.pi)", "(rotations * math.pi)", CFG, "YaRN correction dim: 2*pi -> pi"),
    M("C11", MC, "return max(low, 0), min(high, dim - 1)", "return max(low, 0), min(high, dim)", CFG,
      "YaRN ramp upper clamp dim - 1 -> dim"),
    M("C12", MC, "return yarn_mscale(self.factor, self.mscale_all_dim) if", "return yarn_mscale(self.factor) if", CFG,
      "YaRN softmax mscale ignores mscale_all_dim's value"),
    M("C13", MC, "else 0.1 * mscale * math.log(scale) + 1.0", "else 0.1 * math.log(scale) + 1.0", CFG,
      "yarn_mscale drops its mscale argument"),
    M("C14", MC, "return 1.0 if scale <= 1 else", "return 1.0 if scale < 1 else", CFG,
      "yarn_mscale: scale <= 1 -> scale < 1", eq="at scale == 1 the formula gives 0.1*m*ln(1)+1 = 1.0 as well"),
    M("C15", MC, 'truncate=bool(rope.get("truncate", True))', 'truncate=bool(rope.get("truncate", False))', CFG,
      "YaRN truncate default True -> False"),
    M("C16", MC, "freq = max(1 if freq is None else int(freq), 1)", "freq = max(4 if freq is None else int(freq), 1)",
      CFG, "IndexShare: index_topk_freq default 1 -> 4 (GLM-5/5.1 configs have no freq: every layer full)"),
    M("C17", MC, "n_dense = min(first_k, L)", "n_dense = min(first_k - 1, L)", CFG,
      "mlp_layer_types from first_k_dense_replace: one dense layer short"),
    M("C18", MC, "    if k > E:", "    if k >= E:", CFG, "num_experts_per_tok == n_routed_experts refused"),
    M("C19", MC, "if n_group < 1 or E % n_group:", "if E % n_group:", CFG, "n_group < 1 check dropped",
      eq="_get_int already refuses n_group < 1 (minimum 1) before this line"),
    M("C20", MC, "if n_group > 1 and E // n_group < 2:", "if n_group > 1 and E // n_group < 1:", CFG,
      "groups of one expert accepted (group score = sum of top-2)"),
    M("C21", MC, "if topk_group * (E // n_group) < k:", "if topk_group * (E // n_group) <= k:", CFG,
      "topk_group keeping exactly k experts refused"),
    M("C22", MC, 'ints["qk_rope_head_dim"] > ints["index_head_dim"]',
      'ints["qk_rope_head_dim"] >= ints["index_head_dim"]', CFG, "qk_rope_head_dim == index_head_dim refused"),
    M("C23", MC, 'if d.get("attention_bias", False):', 'if d.get("attn_bias", False):', CFG,
      "attention_bias read under the wrong key (true accepted)"),
    M("C24", MC, "if n_mtp not in (0, 1) or", "if n_mtp not in (0, 1, 2) or", CFG,
      "num_nextn_predict_layers 2 accepted"),
    M("C25", MC, 'd["n_routed_experts"] = d["num_experts"]', 'pass', CFG,
      "the num_experts alias not copied to n_routed_experts"),
    M("C26", MC, "return self.kv_lora_rank + self.qk_rope_head_dim", "return self.kv_lora_rank + self.qk_nope_head_dim",
      CFG, "kv_cache_dim: latent + nope dims (not rope)"),
    M("C27", MC, "return self.qk_nope_head_dim + self.qk_rope_head_dim",
      "return self.qk_nope_head_dim + self.v_head_dim", CFG, "qk_head_dim: nope + v dims (not rope)"),
    M("C28", MC, 'if q.get("fmt", "e4m3") != "e4m3":', 'if q.get("fmt", "e4m3") not in ("e4m3", "e5m2"):', CFG,
      "FP8 fmt e5m2 accepted"),
    # ---- models/loader.py ------------------------------------------------------------------------------------------
    M("L01", ML, 'dim = len(shape) - 1 if proj == "down_proj" else len(shape) - 2',
      'dim = len(shape) - 2 if proj == "down_proj" else len(shape) - 1', LOAD,
      "tp split dim of down vs gate/up swapped"),
    M("L02", ML, "return dim, shard.rank * n, n", "return dim, (shard.rank + 1) * n % shape[dim], n", LOAD,
      "tp slice start off by one rank"),
    M("L03", ML, 'if shard.mode == "ep":\n            return None',
      'if shard.mode == "tp":\n            return None', LOAD, "experts: tp and ep swapped in _shard"),
    M("L04", ML, "(128 if fp8 and shard.world_size > 1 else 1)", "(128 if fp8 else 1)", LOAD,
      "FP8 single rank: a partial last 128-block refused"),
    M("L05", ML, '"moe_intermediate_size": cfg.moe_intermediate_size * cfg.n_shared_experts,',
      '"moe_intermediate_size": cfg.moe_intermediate_size,', LOAD,
      "shared experts' width (moe_intermediate_size x n_shared_experts) not what is checked"),
    M("L06", ML, 'if shard.mode == "ep" and cfg.n_routed_experts % shard.world_size:',
      'if shard.mode == "ep" and cfg.n_routed_experts % shard.world_size and False:', LOAD,
      "ep: experts not divisible by the ranks accepted (the last experts silently dropped)"),
    M("L07", ML, "dtype is None or not dtype.is_floating_point or dtype.itemsize == 1",
      "dtype is None or not dtype.is_floating_point", LOAD, "an FP8 weight without its scale loads as plain"),
    M("L08", ML, 'if p.dtype == torch.float32 and not name.endswith("_scale_inv") and',
      'if p.dtype == torch.float32 and', LOAD, "FP8 block scales cast to the model dtype (bf16)"),
    M("L09", ML, r'_FP32_PARAMS = re.compile(r"\.mlp\.gate\.(weight|e_score_correction_bias)$")',
      r'_FP32_PARAMS = re.compile(r"\.mlp\.gate\.(weight)$")', LOAD, "e_score_correction_bias cast to bf16"),
    M("L10", ML, "target = params[f\"{m[1]}.{m[3]}.{m[4]}\"][e - experts.start]",
      "target = params[f\"{m[1]}.{m[3]}.{m[4]}\"][e % len(experts)]", LOAD,
      "ep expert row: (e - start) -> e % n",
      eq="expert_range gives rank r the experts [r*n, (r+1)*n): start is always a multiple of n = len(experts), "
         "and e % n == e - start for every e the rank keeps (tp: start 0, n = E)"),
    M("L11", ML, r"mlp\.(?:shared_experts\.)?(gate_proj", r"mlp\.(gate_proj", LOAD,
      "shared experts not tp-split"),
    M("L12", ML, '"weights_proj", "eh_proj")', '"weights_proj")', LOAD + [U + "test_fp8.py"],
      "quantizable: MTP eh_proj quantized (reference section 4 keeps it bf16)"),
    # ---- models/checkpoint.py --------------------------------------------------------------------------------------
    M("K01", MK, 'keep_fp32 = name.endswith("e_score_correction_bias") or', 'keep_fp32 =', CKPT,
      "e_score_correction_bias written in the checkpoint dtype (reference: fp32)"),
    M("K02", MK, 'fname = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"',
      'fname = f"model-{i:05d}-of-{num_shards:05d}.safetensors"', CKPT, "shard files numbered from 0"),
    # ---- models/tokenizer.py ---------------------------------------------------------------------------------------
    M("T01", MT, 'stop_names = [eos, *config.get("stop_tokens", [])]', "stop_names = [eos]", TOK,
      "stop_tokens not added to the eos ids"),
    M("T02", MT, 'return token.get("content") if isinstance(token, dict) else token', "return token", TOK,
      "an AddedToken dict special token not unwrapped"),
    M("T03", MT, 'for name in ("tokenizer.json", "tokenizer_config.json"):', 'for name in ("tokenizer_config.json",):',
      TOK, "a missing tokenizer.json not named"),
    M("T04", MT, "if chat_template is not None:\n",
      'if chat_template is not None and not config.get("chat_template"):\n', TOK,
      "an explicit chat_template (--chat-template) loses to the folder's"),
    # ---- cluster/config.py -----------------------------------------------------------------------------------------
    M("E01", EC, "(self.kv_cache_tokens >= self.block_size,", "(self.kv_cache_tokens > self.block_size,", ENG,
      "kv_cache_tokens == block_size refused"),
    M("E02", EC, "0.0 <= self.gpu_memory_utilization < 1.0", "0.0 <= self.gpu_memory_utilization <= 1.0", ENG,
      "gpu_memory_utilization 1.0 accepted"),
    M("E03", EC, "(self.max_num_batched_tokens >= self.max_num_seqs,",
      "(self.max_num_batched_tokens > self.max_num_seqs,", ENG, "max_num_batched_tokens == max_num_seqs refused"),
    M("E04", EC, "(0 <= self.speculative_tokens <= 7,", "(0 <= self.speculative_tokens < 7,", ENG,
      "speculative_tokens 7 refused"),
    M("E05", EC, "else self.kv_cache_tokens // self.block_size",
      "else -(-self.kv_cache_tokens // self.block_size)", ENG, "num_blocks rounds a partial block up"),
    M("E06", EC, "if self.max_model_len is not None and self.max_model_len > num_blocks * self.block_size:",
      "if self.max_model_len is not None and self.max_model_len >= num_blocks * self.block_size:", ENG,
      "check_pool: a context of exactly the pool refused"),
    M("E07", EC, "if self.max_model_len is not None and self.max_model_len > model.max_position_embeddings:",
      "if self.max_model_len is not None and self.max_model_len >= model.max_position_embeddings:", ENG,
      "check_model: max_model_len == max_position_embeddings refused"),
    M("E08", EC, '("bfloat16" if self.resolved_device() == "cuda" else "float32")',
      '("bfloat16" if self.resolved_device() != "cpu" else "bfloat16")', ENG, "dtype auto on CPU -> bfloat16"),
    M("E09", EC, '_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool}',
      '_TYPES = {"str": str, "int": int, "float": float, "bool": bool}', ENG,
      "a float field refuses an integer (step_timeout_s: 60 in YAML)"),
    M("E10", EC, '"step_timeout_s": (self.step_timeout_s > 0,', '"step_timeout_s": (self.step_timeout_s >= 0,', ENG,
      "step_timeout_s 0 accepted"),
    # ---- workers/memory.py -----------------------------------------------------------------------------------------
    M("W01", WM, "return int(free - (1.0 - fraction) * total)", "return int(free - fraction * total)", MEM,
      "kv_budget: fraction instead of (1 - fraction) of the device kept back"),
    M("W02", WM, "(r - slot_bytes * extra_slots) // (slot_bytes * block_size)", "r // (slot_bytes * block_size)", MEM,
      "pool_blocks ignores the fixed extra slots"),
    M("W03", WM, "// len(ranks[s.key]) for s in shares]", "for s in shares]", MEM,
      "ranks sharing a device do not split it"),
    M("W04", WM, "worst = min(range(len(fits)), key=fits.__getitem__)",
      "worst = max(range(len(fits)), key=fits.__getitem__)", MEM, "the largest rank's pool for all"),
    M("W05", WM, "min(free, max(0, limit[0] - limit[1]))", "min(free, limit[0])", MEM,
      "cgroup: free memory not reduced by the cgroup's use"),
    M("W06", WM, 'slot * host_slots if device.type == "cpu" else 0',
      'slot * host_slots if device.type == "cuda" else 0', MEM,
      "host tier counted against a GPU's memory instead of the host's"),
    # ---- cluster/cli.py --------------------------------------------------------------------------------------------
    M("X01", CL, "kv_cache_tokens=a.kv_cache_tokens,", "", CLI, "--kv-cache-tokens not forwarded"),
    M("X02", CL, "template = str(Path(a.chat_template).resolve()) if a.chat_template else None",
      "template = a.chat_template or None", CLI, "--chat-template not made absolute (replicas' cwd differ)"),
    M("X03", CL, "prefix_caching=a.prefix_caching, ", "", CLI, "--no-prefix-caching not forwarded"),
    M("X04", CL, "load_format=a.load_format, ", "", CLI, "--load-format not forwarded"),
    M("X05", CL, "device=a.device, dtype=a.dtype,", "device=a.device,", CLI, "--dtype not forwarded"),
    M("X06", CL, "if a.prefill_replicas < 0:", "if a.prefill_replicas < -1:", CLI,
      "serve --prefill-replicas -1 not refused"),
    M("X07", CL, "num_shards=a.shards)", "num_shards=1)", CLI, "make-checkpoint --shards not forwarded"),
    # ---- cluster/disagg.py prefill_plan ----------------------------------------------------------------------------
    M("D01", DG, 'SAME_KEYS = ("model", "load_format", "kv_cache_dtype")',
      'SAME_KEYS = ("model", "kv_cache_dtype")', PLAN,
      "prefill replicas may use another load_format"),
    M("D02", DG, "if not isinstance(least, int) or isinstance(least, bool) or least < 0:",
      "if not isinstance(least, int) or least < 0:", PLAN, "min_prompt_tokens: true accepted"),
    M("D03", DG, 'if mine != theirs or mine is None and engine.dtype != decode["dtype"]:', "if mine != theirs:", PLAN,
      "dtype check: the auto-on-auto clause dropped",
      eq="mine is None iff the prefill side is dtype auto on device auto, theirs is None iff the decode side is: both "
         "None means both dtypes are 'auto', so the clause can never be true"),
    M("D04", DG, 'if not decode["prefix_caching"]:', "if not engine.prefix_caching:", PLAN,
      "prefix_caching read from the prefill side instead of the decode replicas'"),
    M("D05", DG, "engine = EngineConfig.from_dict({**decode, **spec})",
      "engine = EngineConfig.from_dict({**spec, **decode})",
      PLAN, "prefill overrides lose to the decode config"),
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
    ap.add_argument("--no-new-tests", action="store_true", help=f"do not run {NEW_TESTS}")
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
    with tempfile.TemporaryDirectory(prefix="mut61-") as tmp:
        work = Path(tmp)
        copy_repo(repo, work)
        extra = [NEW_TESTS] if (work / NEW_TESTS).exists() and not a.no_new_tests else []
        every = sorted({t for m in chosen for t in m["tests"]} | set(extra))
        status, dt, last = run_tests(work, python, every, timeout=600)
        print(f"unmutated: {status} in {dt:.0f} s ({last})", flush=True)
        if status != "survived":
            return 2
        rows = []
        for m in chosen:
            path = work / m["file"]
            original = path.read_text()
            path.write_text(original.replace(m["old"], m["new"], 1))
            try:
                status, dt, last = run_tests(work, python, m["tests"] + extra)
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
