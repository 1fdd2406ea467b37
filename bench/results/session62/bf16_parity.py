"""bf16 parity of our model vs Hugging Face transformers (eager), measured against HF fp32.

    .venv/bin/python bench/results/session62/bf16_parity.py            # ~30 s on 2 CPU cores
    .venv/bin/python bench/results/session62/bf16_parity.py --brief    # the summary lines only (mutant runs)

For the tiny random config (fp32 checkpoint, seed 0, as tests/conftest.py's tiny_ckpt) and the embedded trained
model (models/tiny), with ours = our model loaded in bf16 (bf16 KV cache, as served), HF16 / HF32 = transformers
in bf16 / fp32 (eager attention, eager experts):

* e2e: logits of whole prompts (random ids and real text, lengths below and above index_topk) and of a prefill
  followed by one-token decode steps: err_ours = |ours − HF32|, err_hf = |HF16 − HF32| (max, mean).
* per layer, end to end: the same on each decoder layer's output hidden state, and how many query rows have a
  DSA selection / MoE routing different from HF32's.
* per layer, teacher-forced ("TF"): every layer of ours and of HF16 gets HF32's input to that layer (rounded to
  bf16), so each layer's own rounding is measured without inherited drift; rows whose routing or selection in
  that layer differs from HF32's (in ours or in HF16) are set aside, so top-k flips do not enter the means.
  Reported: mean err_ours / mean err_hf ("acc", ≤ 1 = no less accurate than HF) and mean |ours − HF16| / mean
  err_hf ("mimic": how close we are to HF's own bf16 rounding, relative to HF's bf16 error).
* sub-layer ("SL"): each layer's input and attention output forced to HF32's (rounded), as
  tests/integration/test_parity_bf16.py does: normed attention input bit-equal?, MLP output |ours − HF16|, DSA
  selection rows differing from HF16, and the MLA core's error (ours vs HF16, against HF32).
* --mutants: copies the repository to a temp dir once per deliberate bf16 break (MUTANTS below), applies it and runs
  tests/integration/test_parity_bf16.py there; prints which tests fail and why.
* greedy: HF32's greedy continuation of a real-text prompt; at each step (teacher-forced on those tokens, ours
  decoding one token at a time against its bf16 cache) whether ours16 and HF16 pick HF32's token, split by
  HF32's top-1 margin.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from models.cache import KVCache, contiguous_batch  # noqa: E402
from models.checkpoint import write_checkpoint  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.loader import load_model  # noqa: E402
from models.tokenizer import Tokenizer  # noqa: E402
from tests.conftest import CONFIGS, hf_model  # noqa: E402
from tests.integration.test_parity_hf import _ids  # noqa: E402

TINY = ROOT / "models" / "tiny"
KJV = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
       "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
       "And God said, Let there be light: and there was light. And God saw the light, that it was good.")
PY = ("The for statement in Python differs a bit from what you may be used to in C or Pascal. Rather than always "
      "iterating over an arithmetic progression of numbers, or giving the user the ability to define both the "
      "iteration step and halting condition, Python's for statement iterates over the items of any sequence, "
      "a list or a string, in the order that they appear in the sequence.")


def ours_run(model, ids: torch.Tensor, chunks: list[int], force_in: list | None = None) -> dict:
    """Our model in its own dtype with a KV cache of that dtype, fed in ``chunks``. Returns logits [S, V] fp32,
    per layer the output hidden [S, H] fp32 and selections [S, K], per MoE layer the routed experts [S, k].
    ``force_in`` (one prefill chunk only): each layer's input replaced by force_in[l] (teacher forcing)."""
    cfg, S = model.config, ids.numel()
    dtype = model.model.embed_tokens.weight.dtype
    cache = KVCache(cfg, S + 8, dtype)
    outs, sel, rout = {}, {}, {}
    hooks = []

    def pre(mod, args, kwargs):
        a = list(args)
        a[0] = force_in[mod.layer].to(dtype)
        if len(a) > 5:
            a[5] = None
        return tuple(a), {k: v for k, v in kwargs.items() if k != "mlp_out"}

    def post(mod, args, kwargs, out):
        outs.setdefault(mod.layer, []).append((out[0] + out[1]).float())
        sel.setdefault(mod.layer, []).append(out[2])

    for i, layer in enumerate(model.target_layers):
        if force_in is not None:
            hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(layer.register_forward_hook(post, with_kwargs=True))
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda m, a, o, i=i: rout.setdefault(i, []).append(o[0])))
    logits, pos = [], 0
    try:
        with torch.no_grad():
            for n in chunks:
                h = model(ids[pos:pos + n], contiguous_batch([(pos, n)], S + 8), cache)
                logits.append(model.logits(h).float())
                pos += n
    finally:
        for h in hooks:
            h.remove()
    L = cfg.num_hidden_layers
    return {"logits": torch.cat(logits), "hidden": [torch.cat(outs[i]) for i in range(L)],
            "sel": [sel[i][0] if len(sel[i]) == 1 else sel[i] for i in range(L)],
            "route": {i: torch.cat(r) for i, r in rout.items()}}


def hf_run(hf, ids: torch.Tensor, force_in: list | None = None) -> dict:
    """HF over the whole sequence: logits, per layer output hidden / selection, per MoE layer routed experts."""
    layers = hf.model.layers
    index = {id(m): i for i, m in enumerate(layers)}
    outs, sel, rout, hooks = {}, {}, {}, []

    def pre(mod, args, kwargs):
        return (force_in[index[id(mod)]].to(hf.dtype)[None],) + tuple(args[1:]), kwargs

    def post(mod, args, kwargs, out):
        i = index[id(mod)]
        outs[i], sel[i] = out[0][0].float(), out[1][0]

    for i, layer in enumerate(layers):
        if force_in is not None:
            hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(layer.register_forward_hook(post, with_kwargs=True))
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(lambda m, a, o, i=i: rout.__setitem__(i, o[2])))
    try:
        with torch.no_grad():
            logits = hf(ids[None]).logits[0].float()
    finally:
        for h in hooks:
            h.remove()
    return {"logits": logits, "hidden": [outs[i] for i in range(len(layers))],
            "sel": [sel[i] for i in range(len(layers))], "route": rout}


def differing_rows(cfg: ModelConfig, run: dict, ref: dict, layer: int) -> torch.Tensor:
    """Bool [S]: query rows whose DSA selection (as the set of causally visible keys) or MoE routing (as a set)
    in ``layer`` differs from ``ref``'s. Ours marks unselected slots -1; HF's top-k may name masked keys t > s."""
    S = ref["hidden"][layer].shape[0]
    bad = torch.zeros(S, dtype=torch.bool)
    if S > cfg.index_topk:
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        a, b = run["sel"][layer].long(), ref["sel"][layer].long()
        mine = torch.zeros(S, S + 1, dtype=torch.bool).scatter_(1, a + 1, True)[:, 1:] & causal   # -1 → column 0
        theirs = torch.zeros(S, S, dtype=torch.bool).scatter_(1, b, True) & causal
        bad = (mine != theirs).any(-1)
    if layer in ref["route"]:
        a, b = run["route"][layer].sort(-1).values, ref["route"][layer].sort(-1).values
        bad |= (a != b).any(-1)
    return bad


def teacher_forced(ours, hf16, ids: torch.Tensor, ref: dict) -> list[dict]:
    """Per layer: mean |ours − HF32|, mean |HF16 − HF32|, mean |ours − HF16| over the rows where neither bf16
    model's routing/selection differs from HF32's; and how many rows were set aside."""
    ins = [ref["embed"]] + ref["hidden"][:-1]
    o = ours_run(ours, ids, [ids.numel()], force_in=ins)
    h = hf_run(hf16, ids, force_in=ins)
    cfg, out = ours.config, []
    for layer in range(cfg.num_hidden_layers):
        keep = ~(differing_rows(cfg, o, ref, layer) | differing_rows(cfg, h, ref, layer))
        r, a, b = ref["hidden"][layer][keep], o["hidden"][layer][keep], h["hidden"][layer][keep]
        out.append({"ours": (a - r).abs().mean().item(), "hf": (b - r).abs().mean().item(),
                    "ours_hf": (a - b).abs().mean().item(), "dropped": int((~keep).sum()),
                    "ours_max": (a - r).abs().max().item(), "hf_max": (b - r).abs().max().item()})
    return out


def greedy_agreement(ours, hf32, hf16, prompt: list[int], steps: int) -> list[tuple[float, bool, bool]]:
    """HF32's greedy continuation of ``prompt`` (``steps`` tokens, by re-reading the sequence); per step:
    (HF32's top-1 − top-2 logit margin, ours16 picks HF32's token, HF16 picks it). Ours prefills the prompt and
    then decodes the continuation one token at a time against its cache."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            seq.append(int(hf32(torch.tensor(seq)[None]).logits[0, -1].argmax()))
        ids = torch.tensor(seq)
        ref = hf32(ids[None]).logits[0].float()
        h16 = hf16(ids[None]).logits[0].float()
    o16 = ours_run(ours, ids, [len(prompt)] + [1] * steps)["logits"]
    rows = range(len(prompt) - 1, len(seq) - 1)
    res = []
    for r in rows:
        top2 = ref[r].topk(2).values
        res.append((float(top2[0] - top2[1]), bool(o16[r].argmax() == seq[r + 1]), bool(h16[r].argmax() == seq[r + 1])))
    return res


def sublayer(ours, hf32, hf16, ids: torch.Tensor) -> dict:
    """The test's teacher-forced pass (layer inputs and attention outputs forced to HF32's)."""
    from tests.integration.test_parity_bf16 import _err, _hf_pass, _ours_pass

    L = ours.config.num_hidden_layers
    ref = _hf_pass(hf32, ids)
    force = {"x": [ref["x"][i].float() for i in range(L)], "attn": [ref["attn"][i].float() for i in range(L)]}
    theirs, mine = _hf_pass(hf16, ids, force), _ours_pass(ours, ids, force)
    S, rows = ids.numel(), 0
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(L):
        if ours.config.has_indexer(i) and S > ours.config.index_topk:
            a, b = mine["sel"][i].long(), theirs["sel"][i][0].long()
            x = torch.zeros(S, S + 1, dtype=torch.bool).scatter_(1, a + 1, True)[:, 1:] & causal
            y = torch.zeros(S, S, dtype=torch.bool).scatter_(1, b, True) & causal
            rows += int((x != y).any(-1).sum())
    per = [_err(mine["attn"][i], ref["attn"][i]) / _err(theirs["attn"][i], ref["attn"][i]) for i in range(L)]
    return {"norm_equal": all(torch.equal(mine["h"][i], theirs["h"][i]) for i in range(L)),
            "mlp_max": max((mine["mlp"][i].float() - theirs["mlp"][i].float()).abs().max().item() for i in range(L)),
            "logits_max": (mine["logits"] - theirs["logits"]).abs().max().item(), "sel_rows": rows,
            "attn_layers": " ".join(f"{r:.2f}" for r in per),
            "attn_ratio": sum(_err(mine["attn"][i], ref["attn"][i]) for i in range(L))
            / sum(_err(theirs["attn"][i], ref["attn"][i]) for i in range(L))}


R, G = "glmkernels/reference.py", "models/glm5.py"
MUTANTS = {   # name: [(file, old text, new text)]; the first two are the breaks the task names
    "norm_single_round (RMSNorm: weight × normalized in fp32, one rounding; HF rounds before the weight)": [
        (R, "    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)",
         "    return (weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)")],
    "router_bf16 (router logits from a bf16 linear; HF: fp32)": [
        (R, "y = F.linear(x, weight.to(x.dtype)).float() if rounded else F.linear(x.float(), weight.float())",
         "y = F.linear(x, weight.to(x.dtype)).float()")],
    "norm_bf16_core (RMSNorm variance in bf16)": [
        (R, "    xf = x.float()\n    return weight *", "    xf = x\n    return weight *")],
    "experts_fp32_accum (routed experts summed in fp32; HF casts each to bf16 first)": [
        (R, "    out = torch.zeros_like(x)\n    local = topk_idx - expert_offset\n    num_local",
         "    out = torch.zeros_like(x, dtype=torch.float32)\n    local = topk_idx - expert_offset\n    num_local"),
        (R, "        out.index_add_(0, rows, (y * topk_w[rows, slot, None]).to(x.dtype))\n"
            "    return out if shared is None else out + swiglu(x, *shared)\n",
         "        out.index_add_(0, rows, (y * topk_w[rows, slot, None]).float())\n    out = out.to(x.dtype)\n"
         "    return out if shared is None else out + swiglu(x, *shared)\n")],
    "indexer_weights_fp32 (indexer head weights not rounded to bf16; HF rounds)": [
        (G, "ops.linear_f32(h, wp.weight, rounded=True,", "ops.linear_f32(h, wp.weight, rounded=False,")],
    "index_scores_bf16 (indexer q·k in bf16; HF: fp32)": [
        (R, 's = torch.einsum("shd,td->sht", q[a:b].float(), keys) * scale',
         's = torch.einsum("shd,td->sht", q[a:b], keys.to(q.dtype)).float() * scale')],
    "rope_fp32 (rotation in fp32, rounded once; HF rotates in bf16)": [
        (R, "    return torch.cat([a * cos - b * sin, b * cos + a * sin] + ([x[..., d:]] if d < x.shape[-1] else []), "
            "dim=-1)",
         "    a, b, cos, sin = a.float(), b.float(), cos.float(), sin.float()\n"
         "    return torch.cat([(a * cos - b * sin)"
         ".to(x.dtype), (b * cos + a * sin).to(x.dtype)] + ([x[..., d:]] if d < x.shape[-1] else []), dim=-1)")],
    "angles_bf16 (RoPE angles pos × inv_freq in bf16; HF: fp32)": [
        (R, "    ang = positions[:, None] * inv_freq[None, :]\n    return F.embedding",
         "    ang = (positions[:, None].to(table.dtype) * inv_freq[None, :].to(table.dtype)).float()\n"
         "    return F.embedding")],
    "softmax_bf16 (softmax of bf16 scores; CPU softmax computes in fp32 anyway: a no-op here)": [
        (R, "p = torch.softmax(score.float(), dim=-1).to(q_lat.dtype)",
         "p = torch.softmax(score, dim=-1).to(q_lat.dtype)")],
    "probs_fp32 (attention probs kept fp32: more accurate than HF)": [
        (R, "p = torch.softmax(score.float(), dim=-1).to(q_lat.dtype)", "p = torch.softmax(score.float(), dim=-1)"),
        (R, 'out[sl] = torch.einsum("nhk,nkc->nhc", p, lat)',
         'out[sl] = torch.einsum("nhk,nkc->nhc", p, lat.float()).to(out.dtype)')],
    "score_two_roundings (MLA score as it was before session 62's fix: two bf16 dots, their sum rounded again)": [
        (R, '        lat = kv[..., :rkv]\n        score = torch.einsum("nhd,nkd->nhk", q[sl], kv) * scale',
         '        lat, kr = kv[..., :rkv], kv[..., rkv:]\n'
         '        score = (torch.einsum("nhc,nkc->nhk", q_lat[sl], lat)\n'
         '                 + torch.einsum("nhr,nkr->nhk", q_rope[sl], kr)) * scale')],
}


def run_mutants() -> None:
    import os
    import shutil
    import subprocess

    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONDONTWRITEBYTECODE="1")
    for name, edits in MUTANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            dst = Path(tmp) / "repo"
            shutil.copytree(ROOT, dst, symlinks=True,
                            ignore=shutil.ignore_patterns(".git", "__pycache__", ".venv", "runs", "build", "data"))
            for f, old, new in edits:
                text = (dst / f).read_text()
                assert text.count(old) == 1, (name, old)
                (dst / f).write_text(text.replace(old, new))
            r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:warnings", "-q",
                                "--tb=line", "-rf", "tests/integration/test_parity_bf16.py"],
                               cwd=dst, env=env, capture_output=True, text=True)
            lines = [ln for ln in r.stdout.splitlines() if "Error" in ln or "passed" in ln or "failed" in ln]
            print(f"## {name}: {'CAUGHT' if r.returncode else 'passes'}")
            for ln in lines:
                print("   " + ln.replace(str(dst) + "/", ""))


def random_ckpt() -> Path:
    cfg = ModelConfig.from_json(CONFIGS / "glm5-tiny-random.json")
    return write_checkpoint(tempfile.mkdtemp(), cfg, seed=0, dtype="float32")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--brief", action="store_true")
    p.add_argument("--mutants", action="store_true", help="run the bf16 test against each deliberate break")
    p.add_argument("--quick", action="store_true", help="fewer cases, 16 decode steps, 24 greedy steps (mutant runs)")
    args = p.parse_args()
    if args.mutants:
        return run_mutants()
    torch.set_num_threads(2)
    t0 = time.time()
    tok = Tokenizer.from_dir(TINY)
    text = tok.encode(KJV + " " + PY)
    summary = []
    for name, path in [("random", random_ckpt()), ("trained", TINY)]:
        ours16 = load_model(path, dtype=torch.bfloat16, progress=False)
        hf32, hf16 = hf_model(path), hf_model(path, dtype=torch.bfloat16)
        cfg = ours16.config
        if name == "random":
            cases = [(f"rand{S}s{seed}", _ids(S, cfg.vocab_size, seed)) for S in (12, 48, 96, 160) for seed in (1, 2)]
            cases = [cases[2], cases[5]] if args.quick else cases
        else:
            cases = [(f"text{S}", torch.tensor(text[:S])) for S in (24, 64, len(text))]
            cases += [(f"rand{S}s1", _ids(S, cfg.vocab_size, 1)) for S in (48, 160)]
            cases = cases[1:3] if args.quick else cases
        print(f"\n## {name} (index_topk {cfg.index_topk})")
        agg = {"e2e_o": [], "e2e_h": [], "dec_o": [], "tf_acc": [], "tf_mimic": []}
        for label, ids in cases:
            S = ids.numel()
            ref = hf_run(hf32, ids)
            with torch.no_grad():
                ref["embed"] = hf32.model.embed_tokens(ids).float()
            h16 = hf_run(hf16, ids)
            o = ours_run(ours16, ids, [S])
            pre = min(S - 8, max(cfg.index_topk, S // 2)) if S > 16 else S - 4
            pre = max(pre, S - 16) if args.quick else pre
            dec = ours_run(ours16, ids, [pre] + [1] * (S - pre))["logits"]
            eo, eh = (o["logits"] - ref["logits"]).abs(), (h16["logits"] - ref["logits"]).abs()
            ed = (dec[pre - 1:] - ref["logits"][pre - 1:]).abs()
            agg["e2e_o"].append(eo.mean().item())
            agg["e2e_h"].append(eh.mean().item())
            agg["dec_o"].append(ed.mean().item() / eh[pre - 1:].mean().item())
            flips = [(int(differing_rows(cfg, o, ref, l).sum()), int(differing_rows(cfg, h16, ref, l).sum()))
                     for l in range(cfg.num_hidden_layers)]
            tf = teacher_forced(ours16, hf16, ids, ref)
            acc = max(t["ours"] / t["hf"] for t in tf)
            mimic = max(t["ours_hf"] / t["hf"] for t in tf)
            agg["tf_acc"].append(acc)
            agg["tf_mimic"].append(mimic)
            sl = sublayer(ours16, hf32, hf16, ids)
            agg.setdefault("sl_attn", []).append(sl["attn_ratio"])
            agg.setdefault("sl_mlp", []).append(sl["mlp_max"])
            agg.setdefault("sl_sel", []).append(sl["sel_rows"])
            agg.setdefault("sl_norm", []).append(sl["norm_equal"])
            if args.brief:
                continue
            print(f"{label} S={S}: logits err_ours max {eo.max():.3f} mean {eo.mean():.4f} | err_hf max {eh.max():.3f} "
                  f"mean {eh.mean():.4f} | ratio of means {eo.mean() / eh.mean():.2f} | decode (prefill {pre} + "
                  f"{S - pre} steps) err_ours max {ed.max():.3f} mean {ed.mean():.4f} "
                  f"(/ err_hf {ed.mean() / eh[pre - 1:].mean():.2f}) | |ours−HF16| max "
                  f"{(o['logits'] - h16['logits']).abs().max():.3f}")
            print("   rows with routing/selection ≠ HF32 per layer (ours, hf16):", flips)
            print(f"   SL: normed attention inputs bit-equal to HF16: {sl['norm_equal']} | MLP max |ours − HF16| "
                  f"{sl['mlp_max']:.1e} | final logits max |ours − HF16| {sl['logits_max']:.1e} | DSA rows ≠ HF16 "
                  f"{sl['sel_rows']} | MLA core err ours / HF16 per layer {sl['attn_layers']} pooled "
                  f"{sl['attn_ratio']:.3f}")
            for l, (a, b) in enumerate(zip(o["hidden"], h16["hidden"])):
                r = ref["hidden"][l]
                print(f"   L{l} e2e hidden mean |h| {r.abs().mean():.3f}: err_ours max {(a - r).abs().max():.3f} "
                      f"mean {(a - r).abs().mean():.4f} | err_hf max {(b - r).abs().max():.3f} "
                      f"mean {(b - r).abs().mean():.4f}  ||  TF err_ours {tf[l]['ours']:.5f} err_hf {tf[l]['hf']:.5f}"
                      f" acc {tf[l]['ours'] / tf[l]['hf']:.3f} |ours−HF16| {tf[l]['ours_hf']:.5f} "
                      f"mimic {tf[l]['ours_hf'] / tf[l]['hf']:.3f} (rows set aside {tf[l]['dropped']})")
        e2e = sum(agg["e2e_o"]) / sum(agg["e2e_h"])
        per_case = [a / b for a, b in zip(agg["e2e_o"], agg["e2e_h"])]
        line = (f"SUMMARY {name}: e2e mean-err ratio (pooled) {e2e:.3f} [per case {min(per_case):.2f}"
                f"..{max(per_case):.2f}] | decode ratio max "
                f"{max(agg['dec_o']):.2f} | TF acc max {max(agg['tf_acc']):.3f} | TF mimic max "
                f"{max(agg['tf_mimic']):.3f}\n   SL: norms bit-equal {all(agg['sl_norm'])} | MLP max |ours − HF16| "
                f"{max(agg['sl_mlp']):.1e} | DSA rows ≠ HF16 {sum(agg['sl_sel'])} | MLA core pooled err ratio "
                f"{min(agg['sl_attn']):.3f}..{max(agg['sl_attn']):.3f}")
        if name == "trained":
            n = 24 if args.quick else 48
            g = greedy_agreement(ours16, hf32, hf16, tok.encode("The old man said"), n) + \
                greedy_agreement(ours16, hf32, hf16, tok.encode(KJV[:120]), n)
            for tau in (0.0, 0.25, 0.5, 1.0):
                sel = [x for x in g if x[0] > tau]
                line += (f"\n   greedy margin>{tau}: {len(sel)} steps, ours agrees {sum(x[1] for x in sel)}, "
                         f"hf16 agrees {sum(x[2] for x in sel)}")
            miss = sorted((round(m, 3), a, b) for m, a, b in g if not (a and b))
            line += f"\n   greedy misses (margin, ours ok, hf16 ok): {miss}"
        summary.append(line)
        print(line)
    print(f"\n{time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
