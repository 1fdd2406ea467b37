"""Speculative decoding: verification of drafts against the target, and the MTP drafter.

Verify (one request, its k+1 rows: the committed token and k drafts). Greedy: the target's token at
each row, stopping at the first that differs from the draft — exactly what plain decoding emits.
Sampled with a seed: the drafts are drawn with the very noise plain decoding draws each position's token with
(``sampler.fill_seeded_noise``), and verified as greedy ones are — kept while they equal the target's own draw — so
the output is plain decoding's token for token, whether drafts ride or not (so whatever the load). The two draws
share their noise (a Gumbel coupling), so a draft matches with probability at least (1 − TV) / (1 + TV) of the two
distributions, near rejection sampling's 1 − TV (``bench/spec_accept.py`` measures both).
Sampled without a seed: rejection sampling — accept draft d with probability min(1, p(d)/q(d)), else draw from
norm(max(p − q, 0)); a bonus token from p after k acceptances. The output distribution is p's.

Drafter: the MTP layer proposes k tokens per round, reusing one layer k times. Its KV cache is kept
complete for every committed position by running it over each step's rows ("extend"); chained draft
steps write only to per-request scratch slots, so rejected drafts never touch the real cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from scheduler.request import SamplingParams
from workers.sampler import (allowed_mask, fill_seeded_noise, has_penalties, probs_for_rows, sample, sample_on_device,
                             to_device, with_drafts)

def _race(probs: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """A draw from each row of ``probs`` [..., V] by an exponential race: argmax p / e, e ~ Exp(1) — ``noise`` (filled,
    unclamped), or fresh from the global generator. [..., 1] on the device."""
    noise = torch.empty_like(probs).exponential_() if noise is None else noise
    return (probs / noise.clamp_(min=torch.finfo(probs.dtype).tiny)).argmax(dim=-1, keepdim=True)


def verify(logits: torch.Tensor, drafts: Sequence[int], draft_probs: torch.Tensor | None, params: SamplingParams,
           counts: torch.Tensor | None, num_generated: int) -> list[int]:
    """Accepted drafts plus one more token. logits: [k+1, V] target rows; drafts: k ids; draft_probs:
    [k, V] the distribution each draft was drawn from (rejection sampling), None for greedy and seeded requests
    (their drafts are kept while they equal the target's own token); counts: [2, V] the token counts of the prompt
    + output so far (``TokenCounts``; None without penalties), position i's penalties count the first i drafts too.

    Every position is decided at once on the device and read back once: position i's target token (greedy and
    seeded: what ``sample`` gives plain decoding there), or its acceptance test and the replacement drawn from its
    residual (unseeded: a uniform and a replacement each), and the bonus token after k acceptances; the host keeps
    those up to the first rejection. A guided request's rows come masked (each with what may follow the drafts
    before it), so what is kept is what guided plain decoding allows."""
    k = len(drafts)
    assert logits.shape[0] == k + 1
    assert draft_probs is None or params.seed is None, "a seeded request's drafts are verified by their tokens"
    device, exact = logits.device, params.is_greedy or draft_probs is None
    d = to_device(drafts, torch.long, device) if has_penalties(params) or not exact else None   # [k]
    counts = with_drafts(counts, d) if has_penalties(params) else None                  # [k + 1, 2, V]
    if exact:
        tokens = sample(logits, [params] * (k + 1), counts, [num_generated + i for i in range(k + 1)]).token_ids
        n = next((i for i in range(k) if tokens[i] != drafts[i]), k)
        return tokens[:n + 1]                          # the drafts that match, then the target's own token
    draft_probs = draft_probs[:k]                        # the plan may verify fewer drafts than were proposed
    p = probs_for_rows(logits[:k], [params] * k, None if counts is None else counts[:k],
                       [num_generated + i for i in range(k)])                                # [k, V]
    p_d, q_d = p.gather(1, d[:, None])[:, 0], draft_probs.gather(1, d[:, None])[:, 0]   # [k]
    u = torch.rand(k, device=device)
    accept = (q_d > 0) & (u * q_d < p_d)
    residual = (p - draft_probs).clamp(min=0)
    total = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(total > 0, residual / total, p)             # p itself where q covers p everywhere
    fixes = _race(residual)[:, 0]                                        # [k]: a draw from each residual
    bonus = sample_on_device(logits[k:], [params], [num_generated + k], None if counts is None else counts[k:])
    read = torch.cat([accept.long(), fixes, bonus]).tolist()                            # the one read-back
    n = next((i for i in range(k) if not read[i]), k)                                   # the first rejection
    return [*drafts[:n], read[k + n]]                  # its replacement, or after k acceptances the bonus


def pick_draft(logits: torch.Tensor, params: SamplingParams, counts: torch.Tensor | None, num_generated: int,
               so_far: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The next draft from the MTP's logits [V], left on the device: greedy → (the argmax [1], None); drawn → a draw
    from q, the distribution ``sample`` would draw from, by an exponential race: seeded → with the noise plain decoding
    draws this position with (its index among the generated tokens) → ([1], None); unseeded → with fresh noise
    → ([1], q [V]) (what rejection sampling weighs the draft by). counts: [2, V] the token counts of prompt + output
    (None without penalties; the drafts so far are added on the device); num_generated: the output's length; so_far:
    the drafts before this one ([1] each)."""
    if params.is_greedy:
        if params.allowed_token_ids:        # a draft outside them would only be rejected
            logits = logits.masked_fill(~allowed_mask(params.allowed_token_ids, logits.shape[-1], logits.device),
                                        float("-inf"))
        return logits.argmax(dim=-1, keepdim=True), None
    if counts is not None:
        counts = with_drafts(counts, torch.cat(so_far))[-1:] if so_far else counts[None]
    q = probs_for_rows(logits[None], [params], counts, [num_generated + len(so_far)])[0]
    if params.seed is not None:
        noise = fill_seeded_noise(torch.empty_like(q), params.seed, num_generated + len(so_far))
        return _race(q, noise), None
    return _race(q), q


class Drafter(Protocol):
    """Proposes draft tokens for requests that just sampled. An external drafter (e.g. a DFlash-style block
    drafter) implements the same two calls."""

    def extend(self, hidden: torch.Tensor, next_ids: torch.Tensor, batch, on_pieces: bool = False) -> None: ...

    def propose(self, rows: list[int], requests: list, num_drafts: int,
                world_size: int) -> list[tuple[list[int], torch.Tensor | None]]: ...


@dataclass
class DraftRequest:
    """What the drafter needs about one drafting request."""

    req_id: str
    position: int            # the last committed position (its row was the last valid row of the step)
    block_ids: Sequence[int]
    params: SamplingParams
    counts: torch.Tensor | None   # [2, V] token counts of prompt + output (penalties; ``TokenCounts``), else None
    num_generated: int       # output tokens, including the one just committed
    scratch: int             # index of this request's scratch region


class MtpDrafter:
    """The MTP layer as drafter. ``extend`` runs it over the step's rows (collective: every rank calls it
    with the step's shape); ``propose`` chains k-1 more single-row steps (every rank runs them too)."""

    def __init__(self, model, cache, block_size: int, scratch_base: int, scratch_len: int, stage, pieces=None):
        self.model, self.cache, self.block_size = model, cache, block_size
        self.scratch_base, self.scratch_len, self.stage = scratch_base, scratch_len, stage
        self.pieces = pieces          # ``PieceGraphs`` with ``draft_rows``: the passes on per-layer graphs, or None
        self.share_index = model.config.index_share_for_mtp_iteration
        self._hn: torch.Tensor | None = None
        self._topk: torch.Tensor | None = None

    def extend(self, hidden: torch.Tensor, next_ids: torch.Tensor, batch, on_pieces: bool = False) -> None:
        """hidden: [N, H] the step's final target hidden states; next_ids: [N] the token after each row.
        ``on_pieces``: the pass runs on ``pieces`` (the runner's call: the step's rows fit them)."""
        self._hn, self._topk = self._forward(hidden, next_ids, batch, None, on_pieces)

    def _forward(self, hidden, ids, batch, topk, on_pieces: bool):
        if on_pieces and self.pieces is not None:
            return self.pieces.mtp_forward(hidden, ids, batch, topk)
        return self.model.mtp_forward(hidden, ids, batch, self.cache, topk)

    def propose(self, rows: list[int], requests: list[DraftRequest], num_drafts: int,
                world_size: int) -> list[tuple[list[int], torch.Tensor | None]]:
        """Drafts for each request from its extend row ``rows[i]``; every rank runs num_drafts-1 chained
        steps (with 0 rows where it has no drafting request). Returns (draft ids, draft probs [k, V] or None)."""
        from models.cache import Batch, build_batch
        from scheduler.shapes import StepShape

        drafts = [[] for _ in requests]           # [1] on the device each (read back once, at the end)
        probs = [[] for _ in requests]
        hn = self._hn[rows] if rows else self._hn[:0]
        topk = self._topk[rows] if rows else None
        for j in range(num_drafts):
            if requests:
                logits = self.model.logits(hn)
                for i, r in enumerate(requests):
                    tok, q = pick_draft(logits[i], r.params, r.counts, r.num_generated, drafts[i])
                    drafts[i].append(tok)
                    probs[i].append(q)
            if j == num_drafts - 1:
                break
            batch = Batch(*self._chain_rows(requests, j)) if requests else build_batch([], self.block_size,
                                                                                        self._hn.device)
            self.stage(StepShape("dp", 1, world_size, None), len(requests))
            ids = torch.cat([d[-1] for d in drafts]) if requests else torch.zeros(0, dtype=torch.long,
                                                                                 device=self._hn.device)
            hn, topk2 = self._forward(hn, ids, batch, topk if self.share_index else None,
                                      self.pieces is not None and self.pieces.fits(len(requests)))
            topk = topk if self.share_index else topk2
        return [(torch.cat(d).tolist() if d else [], torch.stack(p) if p and p[0] is not None else None)
                for d, p in zip(drafts, probs)]


    def _chain_rows(self, requests: list[DraftRequest], j: int):
        """Positions p+1+j: real slots for 0..p, scratch slots beyond (the real cache stays untouched)."""
        from models.cache import slots_for

        dev = self._hn.device
        positions, slot_mapping, seq_rows, seq_slots = [], [], [], []
        for i, r in enumerate(requests):
            real = slots_for(r.block_ids, r.position + 1, self.block_size, dev)
            base = self.scratch_base + r.scratch * self.scratch_len
            scratch = torch.arange(base, base + j + 1, device=dev)
            slots = torch.cat([real, scratch])
            positions.append(r.position + 1 + j)
            slot_mapping.append(int(scratch[-1]))
            seq_rows.append((i, 1))
            seq_slots.append(slots)
        return (torch.tensor(positions, device=dev), torch.tensor(slot_mapping, device=dev), seq_rows, seq_slots)
