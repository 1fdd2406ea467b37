"""Evaluate the embedded tiny model: held-out perplexity, MTP agreement, and a greedy sample.

Held-out text is ``data/corpus/heldout.txt`` tokenized as for training (blocks joined by <|endoftext|>);
``--windows`` windows of t_0..t_{S+1} (S = ``--seq-len``), evenly spaced over it, each run from an empty
cache with the checkpoint's sparse attention (``index_topk`` keys per query):

* perplexity: exp of the mean, over p < S, of the main head's cross-entropy on t_{p+1} given t_0..t_p.
  The same with dense attention (every key selected) is printed beside it, to show what DSA costs.
* MTP agreement: for p < S-1, the MTP head's argmax at p (its input: the final-normed hidden of p and the
  actual t_{p+1}) against the main model's greedy prediction of t_{p+2} given the actual t_0..t_{p+1}
  (argmax of the main head at p+1). That is the acceptance rate of a one-token greedy draft whenever the
  previous token was accepted. The MTP head's top-1 accuracy against the actual t_{p+2} is printed too.
* a greedy continuation of ``--prompt`` (``--max-new`` tokens, KV-cache decode, stops at an EOS id).

Usage: ``python -m tools.eval_tiny [--model models/tiny] [--windows 64] [--prompt "The old man said"]``
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.cache import KVCache, contiguous_batch
from models.glm5 import GlmForCausalLM
from models.loader import load_model
from models.tokenizer import Tokenizer
from tools.train_tiny import EOS_ID, MODEL_DIR, load_tokens, set_index_topk, step_batch


@torch.no_grad()
def score_windows(model: GlmForCausalLM, windows: torch.Tensor, kv_fp8: bool = False) -> dict[str, float]:
    """windows: [B, S+2] → summed main CE, MTP agreement/accuracy counts and the number of positions."""
    B, S = windows.shape[0], windows.shape[1] - 2
    batch, cache = step_batch(B, S), KVCache(model.config, B * S, torch.float32, fp8=kv_fp8)
    hidden = model(windows[:, :S].reshape(-1), batch, cache)                        # [B*S, H]
    logits = model.logits(hidden)                                                   # [B*S, V]
    ce = F.cross_entropy(logits, windows[:, 1:S + 1].reshape(-1), reduction="sum")
    main_next = logits.argmax(-1).view(B, S)                                        # [:, p] predicts t_{p+1}
    mtp_hidden, _ = model.mtp_forward(hidden, windows[:, 1:S + 1].reshape(-1), batch, cache)
    mtp_next2 = model.logits(mtp_hidden).argmax(-1).view(B, S)                      # [:, p] predicts t_{p+2}
    return {"ce": ce.item(), "n": B * S,
            "main_hit": (main_next == windows[:, 1:S + 1]).sum().item(),
            "agree": (mtp_next2[:, :-1] == main_next[:, 1:]).sum().item(),
            "mtp_hit": (mtp_next2[:, :-1] == windows[:, 2:S + 1]).sum().item(), "n_mtp": B * (S - 1)}


def evaluate(model: GlmForCausalLM, tokens: np.ndarray, num_windows: int, seq_len: int,
             batch_size: int = 8, kv_fp8: bool = False) -> dict[str, float]:
    starts = np.linspace(0, len(tokens) - seq_len - 2, num_windows).astype(np.int64)
    windows = torch.from_numpy(np.stack([tokens[s:s + seq_len + 2] for s in starts]).astype(np.int64))
    totals: dict[str, float] = {}
    for i in range(0, num_windows, batch_size):
        for k, v in score_windows(model, windows[i:i + batch_size], kv_fp8).items():
            totals[k] = totals.get(k, 0) + v
    return {"perplexity": math.exp(totals["ce"] / totals["n"]), "main_top1": totals["main_hit"] / totals["n"],
            "mtp_agreement": totals["agree"] / totals["n_mtp"], "mtp_top1": totals["mtp_hit"] / totals["n_mtp"],
            "tokens": totals["n"]}


def text_tokens(path: Path, model_dir: Path) -> np.ndarray:
    """A text file's token ids as ``load_tokens`` makes the held-out split's: blocks at blank lines, each ended by
    <|endoftext|>."""
    tok = Tokenizer.from_dir(model_dir)
    blocks = [b for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    return np.array([t for b in blocks for t in tok.encode(b) + [EOS_ID]], dtype=np.int64)


@torch.no_grad()
def greedy_generate(model: GlmForCausalLM, prompt_ids: list[int], max_new: int,
                    stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Prefill the prompt, then decode one token per step against the KV cache; returns the new ids."""
    capacity = len(prompt_ids) + max_new
    cache = KVCache(model.config, capacity, torch.float32)
    step_ids, pos, out = list(prompt_ids), 0, []
    while len(out) < max_new:
        batch = contiguous_batch([(pos, len(step_ids))], capacity)
        hidden = model(torch.tensor(step_ids), batch, cache)
        nxt = int(model.logits(hidden[-1:]).argmax(-1))
        pos += len(step_ids)
        out.append(nxt)
        step_ids = [nxt]
        if nxt in stop_ids:
            break
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=MODEL_DIR)
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--prompt", default="The old man said")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--text", type=Path, default=None,
                   help="evaluate on this text file (blocks split at blank lines) instead of the held-out split")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                   help="fp8: the cache's MLA rows packed in FP8 (kv_cache_dtype fp8); the perplexity with the "
                        "model's dtype is printed beside it")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("$ python -m tools.eval_tiny " + shlex.join(sys.argv[1:]))

    model = load_model(args.model, dtype=torch.float32, progress=False)
    cfg = model.config
    tokens = load_tokens("heldout") if args.text is None else text_tokens(args.text, args.model)
    fp8 = args.kv_cache_dtype == "fp8"
    sparse = evaluate(model, tokens, args.windows, args.seq_len, kv_fp8=fp8)
    if fp8:
        plain = evaluate(model, tokens, args.windows, args.seq_len)
        print(f"FP8 KV cache: perplexity {sparse['perplexity']:.3f} (model dtype: {plain['perplexity']:.3f}, "
              f"{sparse['perplexity'] / plain['perplexity'] - 1:+.2%}); top-1 {sparse['main_top1']:.4f} "
              f"({plain['main_top1']:.4f}); MTP agreement {sparse['mtp_agreement']:.4f} ({plain['mtp_agreement']:.4f})")
    set_index_topk(model, args.seq_len)
    dense = evaluate(model, tokens, args.windows, args.seq_len, kv_fp8=fp8)
    set_index_topk(model, cfg.index_topk)
    print(f"{'held-out' if args.text is None else args.text}: {args.windows} windows x {args.seq_len} tokens = {sparse['tokens']:,} predictions")
    print(f"  main head perplexity      {sparse['perplexity']:8.2f}  (index_topk {cfg.index_topk}; "
          f"dense attention: {dense['perplexity']:.2f})")
    print(f"  main head top-1 accuracy  {sparse['main_top1']:8.3f}")
    print(f"  MTP agreement with main greedy t+2  {sparse['mtp_agreement']:.3f}")
    print(f"  MTP top-1 accuracy on actual t+2    {sparse['mtp_top1']:.3f}")

    tok = Tokenizer.from_dir(args.model)
    new = greedy_generate(model, tok.encode(args.prompt), args.max_new, tuple(cfg.eos_token_ids))
    print(f"greedy sample ({len(new)} tokens):\n{args.prompt}{tok.decode(new, skip_special_tokens=False)}")


if __name__ == "__main__":
    main()
