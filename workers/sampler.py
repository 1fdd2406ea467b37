"""Token sampling: penalties, greedy / temperature / top-k / top-p / min-p, per-request seeds, logprobs.

Order (as vLLM): penalties on the raw logits, then greedy rows take the argmax; sampled rows are divided
by their temperature, filtered by top-k, top-p and min-p, and drawn with an exponential race
(``argmax(p / q)``, ``q ~ Exp(1)``, p known up to a factor per row), which samples exactly from ``p``. A
seeded row draws its noise from its own generator seeded by ``(seed, num_generated)``, so its token depends
only on that pair and the row's logits: it repeats alone, in any batch and after preemption. Logprobs come
from the raw logits. ``sample_on_device`` (and ``row_logprobs``) give the same without reading them back.

Penalties read a row's token counts — [2, V] per row: every id of its history, and its generated ids — on the
device: a request keeps its own (``TokenCounts``, fed the ids it commits, or one sampled on the device and not yet
read back), so no step copies a history; ``history_counts`` builds them from host lists.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from glmkernels import ops
from glmkernels.reference import TOPK_SELECT, nucleus, top_k_weights  # noqa: F401  (TOPK_SELECT: bench scripts')
from scheduler.request import SamplingParams

_SEED_MULT = 1_000_003
_SEED_MASK = (1 << 63) - 1      # the bits of a seed torch's CPU generator keeps


@dataclass
class SampleOutput:
    """One sampled token per row, with logprobs where the row's params asked for them."""

    token_ids: list[int]
    logprobs: list[float | None]  # logprob of the chosen token under the raw logits
    top_logprobs: list[list[tuple[int, float]] | None]  # top-n (id, logprob), sorted descending


class StepMasks:
    """The bitmasks (for ``allow_only``) of a step's guided requests, ``{req_id: [int32 words or None per sampled
    row]}`` (a verify round has a row per draft and one more), built on first use: by the runner at sampling, after it
    launched the step's forward — so the host builds them while the device runs it — or, for a step sent to another
    process, as the step is pickled. ``build``: returns (req_id, row masks) pairs."""

    __slots__ = ("_build", "_rows")

    def __init__(self, build: Callable[[], Iterable] | None = None, rows: dict | None = None):
        self._build, self._rows = build, rows

    def rows(self) -> dict:
        if self._rows is None:
            self._rows, self._build = dict(self._build()), None
        return self._rows

    def __reduce__(self):
        return StepMasks, (None, self.rows())


def allow_only(logits: Tensor, masks: Sequence) -> Tensor:
    """``logits`` [B, V] with each row that has a mask set to -inf outside it (a copy; rows without one unchanged): the
    tokens structured output allows (``cluster/guided.py``), int32 words (an array or a tensor; None: no mask) with
    token t at bit t % 32 of word t // 32.
    The masked logits are the row's raw logits from here on: its logprobs are over the allowed tokens."""
    if all(m is None for m in masks):
        return logits
    every = torch.full((-(-logits.shape[1] // 32),), -1, dtype=torch.int32)                     # all bits set
    words = torch.stack([every if m is None else torch.as_tensor(m) for m in masks])             # [B, ⌈V / 32⌉]
    if logits.is_cuda:      # from pinned memory, not waiting: the launches below queue behind the forward meanwhile
        words = words.pin_memory().to(logits.device, non_blocking=True)
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32, device=logits.device)) & 1
    allowed = bits.flatten(1)[:, :logits.shape[1]].bool()                                        # [B, V]
    return logits.masked_fill(~allowed, float("-inf"))


def sample(
    logits: Tensor,
    params: list[SamplingParams],
    counts: Tensor | None,
    num_generated: list[int],
) -> SampleOutput:
    """Sample one token per row.

    logits: [B, V], any float dtype (computed in fp32). counts: [B, 2, V] each row's token counts (every id of its
    history, its generated ids), read by penalties only (None: no row has any). num_generated[i]: index of the token
    being sampled (with the seed, it fixes the row's random draw).
    """
    _check_batch(logits, params, counts)
    assert len(num_generated) == len(params), "one num_generated per row"
    raw = logits.float()  # [B, V]
    tokens = _choose(apply_penalties(raw, params, counts, num_generated), params, num_generated)
    logprobs = row_logprobs(raw, params, tokens)
    chosen = tokens.tolist()
    if logprobs is None:
        return SampleOutput(token_ids=chosen, logprobs=[None] * len(chosen), top_logprobs=[None] * len(chosen))
    return SampleOutput(chosen, *logprobs.read(params))


def sample_on_device(logits: Tensor, params: list[SamplingParams], num_generated: list[int],
                     counts: Tensor | None = None) -> Tensor:
    """``sample``'s tokens [B], left on the device: nothing here waits for the GPU, so a caller can launch more work
    fed these tokens before it reads them back. No logprobs."""
    _check_batch(logits, params, counts)
    assert len(num_generated) == len(params), "one num_generated per row"
    return _choose(apply_penalties(logits.float(), params, counts, num_generated), params, num_generated)


def _choose(processed: Tensor, params: list[SamplingParams], num_generated: list[int]) -> Tensor:
    """One token per row of the penalized logits [B, V] fp32, on their device: [B] int64."""
    sampled_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if not sampled_rows:            # greedy rows, or none (a rank without rows in a group's step)
        return processed.argmax(dim=-1)  # [B] (ties -> lowest id)
    every = len(sampled_rows) == len(params)      # (no greedy row: no argmax, no pick of rows and no scatter back)
    token_ids = None if every else processed.argmax(dim=-1)  # [B]; greedy rows keep this
    rows = None if every else to_device(sampled_rows, torch.long, processed.device)
    logits, drawing = processed if every else processed[rows], [params[i] for i in sampled_rows]
    noise = _exponential_noise(processed.shape[1], processed.device, params, num_generated, sampled_rows)
    top_p = _top_p(drawing, logits.device) if any(p.top_p < 1.0 for p in drawing) else None
    if any(0 < p.top_k < logits.shape[1] for p in drawing):     # on the GPU a few passes over the vocabulary, no sort
        drawn = ops.top_k_race(_scaled(logits, drawing), noise, [p.top_k for p in drawing], top_p,
                               _min_p(drawing, logits.device))
    elif top_p is not None:                                     # top-p without top-k (GLM's advice)
        drawn = ops.top_p_race(_scaled(logits, drawing), noise, top_p, _min_p(drawing, logits.device))
    else:
        drawn = (_filtered_weights(logits, drawing)[0] / noise).argmax(dim=-1)
    if every:
        return drawn
    token_ids[rows] = drawn
    return token_ids


def warm_up(vocab_size: int, device: torch.device | str) -> None:
    """Run the sampler once in each form a batch can ask of its kernels — a top-k, a top-p, both or neither, each one
    value for every row or one per row (a tensor, not a float: another kernel variant), a min-p likewise or none, a
    draw (``sample_on_device``) or the kept weights (``probs_for_rows``), beside a greedy row or not, from logits at a
    row's offset (a verify's bonus row: another pointer alignment where a row's bytes are not a multiple of 16) or
    not — and penalties, on random logits of the model's vocabulary, so that no variant compiles while serving (a
    Triton compile stalls a step for about a second)."""
    logits = torch.randn(3, vocab_size, device=device)
    counts = torch.zeros(3, 2, vocab_size, dtype=torch.int32, device=device)
    values = (((0, 0), (20, 20), (20, 50)), ((1.0, 1.0), (0.9, 0.9), (0.9, 0.95)),     # (top-k, top-p, min-p of
              ((0.0, 0.0), (0.05, 0.05), (0.05, 0.1)))                                # two rows: none, one, each)
    for (k0, k1), (p0, p1), (m0, m1) in itertools.product(*values):
        drawn = [SamplingParams(top_k=k, top_p=p, min_p=m) for k, p, m in ((k0, p0, m0), (k1, p1, m1))]
        beside_greedy = [SamplingParams(temperature=0.0), *drawn]
        for rows, params in ((logits[:2], drawn), (logits[1:], drawn), (logits, beside_greedy)):
            sample_on_device(rows, params, [0] * len(params))
            probs_for_rows(rows, params)
    penalized = SamplingParams(top_p=0.9, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.3)
    for at, counts_at in itertools.product((0, 1), (0, 1)):
        sample_on_device(logits[at:at + 2], [penalized] * 2, [1, 1], counts[counts_at:counts_at + 2])


def probs_for_rows(logits: Tensor, params: list[SamplingParams], counts: Tensor | None = None,
                   num_generated: list[int] | None = None) -> Tensor:
    """The distribution ``sample`` draws from, per row: [B, V] fp32 (greedy rows: one-hot at the argmax).

    For speculative decoding's rejection sampling, which needs the target and draft distributions.
    """
    _check_batch(logits, params, counts)
    processed = apply_penalties(logits.float(), params, counts, num_generated)  # [B, V]
    sampled_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    every = len(sampled_rows) == len(params)      # (a drawn request's rows: no one-hot rows, pick or scatter back)
    if sampled_rows:
        rows = None if every else to_device(sampled_rows, torch.long, processed.device)
        weights = _kept_weights(processed if every else processed[rows], [params[i] for i in sampled_rows])
        drawn = weights / weights.sum(dim=-1, keepdim=True)
        if every:
            return drawn
    probs = torch.zeros_like(processed).scatter_(1, processed.argmax(dim=-1, keepdim=True), 1.0)
    if sampled_rows:
        probs[rows] = drawn
    return probs


def _kept_weights(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """``_filtered_weights``' weights in vocabulary order [S, V] — on the GPU without a sort or topk where a row has a
    top-k or a top-p (``ops.kept_weights``)."""
    if any(0 < p.top_k < logits.shape[1] or p.top_p < 1.0 for p in params):
        top_p = _top_p(params, logits.device) if any(p.top_p < 1.0 for p in params) else None
        return ops.kept_weights(_scaled(logits, params), [p.top_k for p in params], top_p,
                                _min_p(params, logits.device))
    return _filtered_weights(logits, params)[0]


def apply_penalties(logits: Tensor, params: list[SamplingParams], counts: Tensor | None,
                    num_generated: list[int] | None = None) -> Tensor:
    """Repetition (prompt + generated ids), presence and frequency (generated ids only) penalties, then the rows'
    logit biases and ``allowed_token_ids``, then ``min_tokens``: a row sampling token ``num_generated[i]`` < its
    ``min_tokens`` may not sample its ``min_tokens_ban`` ids — unless they are all it has left (a grammar that allows
    only a stop token).

    logits: [B, V] fp32; counts: [B, 2, V] (every id of the row's history, its generated ids); returns a new [B, V]
    tensor (the input is left untouched), or the input when no row has penalties or biases.
    repetition: logit / pen where logit > 0, else logit * pen (HF / vLLM).
    presence / frequency: logit - presence * [count > 0] - frequency * count (OpenAI / vLLM).
    logit_bias: logit + bias at each named id (OpenAI; a masked -inf stays -inf). allowed_token_ids: -inf elsewhere
    (vLLM's), unless that leaves the row nothing.
    """
    out = logits
    if any(has_penalties(p) for p in params):
        assert counts is not None, "rows with penalties need their token counts"
        # few launches: on the GPU each op here costs more host time than device time (one copy of the values, and
        # the op: one launch on the GPU, the reference's ~12)
        values = to_device([[p.repetition_penalty, p.presence_penalty, p.frequency_penalty] for p in params],
                           torch.float32, logits.device)  # [B, 3]
        out = ops.penalize(logits, counts, values)
    if any(p.logit_bias for p in params):
        where = [(i, tok, value) for i, p in enumerate(params) for tok, value in p.logit_bias]
        index = to_device([[i for i, _, _ in where], [tok for _, tok, _ in where]], torch.long, logits.device)
        bias = to_device([value for _, _, value in where], torch.float32, logits.device)
        out = out.index_put((index[0], index[1]), bias, accumulate=True)    # a new tensor: the input stays
    if any(p.allowed_token_ids for p in params):
        V, device = logits.shape[1], logits.device
        allowed = torch.stack([allowed_mask(p.allowed_token_ids, V, device) for p in params])      # [B, V]
        out = _unless_empty(out.masked_fill(~allowed, float("-inf")), out)
    where = [(i, tok) for i, p in enumerate(params) if num_generated is not None and num_generated[i] < p.min_tokens
             for tok in p.min_tokens_ban]
    if where:
        index = to_device(list(zip(*where)), torch.long, logits.device)
        out = _unless_empty(out.index_put((index[0], index[1]), out.new_full((), float("-inf"))), out)
    return out


@functools.lru_cache(maxsize=64)
def allowed_mask(ids: tuple[int, ...], vocab: int, device: torch.device) -> Tensor:
    """A row's ``allowed_token_ids`` as a [V] bool mask on ``device`` (every id where it has none): built once a
    request, not every step."""
    mask = torch.zeros(vocab, dtype=torch.bool) if ids else torch.ones(vocab, dtype=torch.bool)
    mask[list(ids)] = True
    return mask.to(device)


def _unless_empty(masked: Tensor, out: Tensor) -> Tensor:
    """``masked``'s rows, but ``out``'s where a row of ``masked`` has nothing left (no host copy to wait on)."""
    return torch.where(masked.amax(dim=-1, keepdim=True) > float("-inf"), masked, out)


def _filtered_weights(logits: Tensor, params: list[SamplingParams]) -> tuple[Tensor, Tensor | None]:
    """Temperature, then top-k, top-p and min-p: each row's distribution up to a factor, as the weights
    exp((logit - max) / T) of its kept tokens (the most likely weighs 1) and 0 for the dropped ones.

    logits: [S, V] fp32. Without top-k and top-p: ([S, V] in vocabulary order, None). With either: ([S, W] in
    descending order, order [S, W] the token at each position), W = V — or, when every row has a top-k of at most
    ``TOPK_SELECT``, the largest top-k: those are selected, not the vocabulary sorted (``top_k_weights``). Nothing is
    normalized (a factor changes no race, and top-p compares against the kept mass): on the GPU each full-vocabulary
    pass is a launch, and a softmax or a cumsum of one long row runs on one block (bench/sampler.py). A top-k of V or
    more is none.
    """
    device, vocab_size = logits.device, logits.shape[1]
    scaled = _scaled(logits, params)  # [S, V]
    order = None
    if not any(0 < p.top_k < vocab_size or p.top_p < 1.0 for p in params):  # min-p alone needs no order
        weights = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))  # [S, V]
    else:
        weights, order = top_k_weights(scaled, [p.top_k for p in params], keys=ops.value_id_keys)
        if any(p.top_p < 1.0 for p in params):      # (of the top-k's mass)
            weights = nucleus(weights, _top_p(params, device))
    if (min_p := _min_p(params, device)) is not None:
        weights = weights.masked_fill(weights < min_p, 0.0)
    return weights, order


def _scaled(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """The logits [S, V] over each row's temperature. (T 1 everywhere — GLM's advice — divides nothing: one launch
    and one copy fewer; a division by a scalar would not be one by a tensor on CUDA, which multiplies by the
    reciprocal.)"""
    temperatures = [p.temperature for p in params]
    return logits if all(t == 1.0 for t in temperatures) else logits / _row_values(temperatures, logits.device)


def _top_p(params: list[SamplingParams], device: torch.device) -> Tensor | float:
    """Each row's top-p; 1 (no top-p) as inf, so that rounding never drops the tail."""
    return _row_values([p.top_p if p.top_p < 1.0 else float("inf") for p in params], device, scalar=True)


def _min_p(params: list[SamplingParams], device: torch.device) -> Tensor | float | None:
    """Each row's min-p (relative to the most likely token, whose weight is 1), None where no row has one."""
    return _row_values([p.min_p for p in params], device, scalar=True) if any(p.min_p > 0.0 for p in params) else None


def _exponential_noise(
    vocab_size: int,
    device: torch.device,
    params: list[SamplingParams],
    num_generated: list[int],
    sampled_rows: list[int],
) -> Tensor:
    """Exp(1) noise [S, V] for the sampled rows: seeded rows from their own generator, others global."""
    noise = torch.empty(len(sampled_rows), vocab_size, device=device)
    if any(params[row].seed is None for row in sampled_rows):
        noise.exponential_()  # global generator for unseeded rows
    for out_row, row in enumerate(sampled_rows):
        if params[row].seed is not None:
            fill_seeded_noise(noise[out_row], params[row].seed, num_generated[row])
    # Exp(1) can round to 0; a zero would make p / q infinite for a zero-probability token.
    return noise.clamp_(min=torch.finfo(noise.dtype).tiny)


def fill_seeded_noise(row: Tensor, seed: int, index: int) -> Tensor:
    """Fill ``row`` [V] fp32 with the Exp(1) noise a seeded request's ``index``-th generated token is drawn with
    (unclamped; its own generator, seeded by ``(seed, index)``). Speculation draws a seeded request's drafts with the
    same noise, so each draft is the token plain decoding would draw if the draft model were right."""
    gen = torch.Generator(device=row.device)
    gen.manual_seed(_generator_seed(seed, index))
    return row.exponential_(generator=gen)


def _generator_seed(seed: int, index: int) -> int:
    """The generator seed of a request's ``index``-th draw. torch's CPU generator keeps 63 bits, so a value past them
    is mixed down (splitmix64's finalizer) rather than cut: int64 seeds that differ in the top bit alone (-1 and
    2**63 - 1) drew the same tokens. Values within 63 bits (every seed below ~9e12) are kept as they were."""
    h = (seed * _SEED_MULT + index) & ((1 << 64) - 1)
    if h > _SEED_MASK:
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & ((1 << 64) - 1)
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & ((1 << 64) - 1)
        h ^= h >> 31
    return h & _SEED_MASK


@dataclass
class RowLogprobs:
    """``sample``'s logprobs from the raw logits, for the rows that asked (``rows``): the chosen token's [R] and the
    top max-n [R, n] (values, ids) — on the device until ``to_host`` copies them (without waiting) and ``read``."""

    rows: list[int]
    chosen: Tensor
    top_logp: Tensor
    top_ids: Tensor

    def to_host(self) -> RowLogprobs:
        """Asynchronous copies into pinned memory (CUDA; elsewhere plain ones): read them once the stream got there."""
        if not self.chosen.is_cuda:
            return self
        return RowLogprobs(self.rows, *(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                                        for t in (self.chosen, self.top_logp, self.top_ids)))

    def take(self, keep: list[int]) -> RowLogprobs | None:
        """These logprobs for the batch rows ``keep`` (in order), as a batch of those rows; None when none asked."""
        at = {i: n for n, i in enumerate(keep)}
        mine = [j for j, i in enumerate(self.rows) if i in at]
        if not mine:
            return None
        index = to_device(mine, torch.long, self.chosen.device)
        return RowLogprobs([at[self.rows[j]] for j in mine], self.chosen[index], self.top_logp[index],
                           self.top_ids[index])

    def read(self, params: list[SamplingParams]) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
        """(chosen-token logprob, top-n (id, logprob) pairs) per row of the batch; None for rows that did not ask."""
        logprobs: list[float | None] = [None] * len(params)
        top: list[list[tuple[int, float]] | None] = [None] * len(params)
        chosen, top_logp, top_ids = self.chosen.tolist(), self.top_logp.tolist(), self.top_ids.tolist()
        for j, i in enumerate(self.rows):
            n = params[i].logprobs
            logprobs[i] = chosen[j]
            # tokens a structured-output mask ruled out (logprob -inf) are no alternatives: fewer than n then
            top[i] = [(t, lp) for t, lp in zip(top_ids[j][:n], top_logp[j][:n]) if lp != float("-inf")] if n else []
        return logprobs, top


def row_logprobs(raw: Tensor, params: list[SamplingParams], tokens: Tensor) -> RowLogprobs | None:
    """Logprobs of the chosen ``tokens`` [B] and the top n under the raw logits [B, V] (fp32), for the rows whose
    params ask; None when none does. Nothing here waits for the GPU."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None
    index = to_device(rows, torch.long, raw.device)
    logp = torch.log_softmax(raw[index], dim=-1)  # [R, V]
    chosen = logp.gather(1, tokens[index][:, None]).squeeze(1)  # [R]
    top_logp, top_ids = logp.topk(max(params[i].logprobs for i in rows), dim=-1)  # [R, max_n] each
    return RowLogprobs(rows, chosen, top_logp, top_ids)


def token_logprobs(logits: Tensor, tokens: Sequence[int], n: int) -> list[tuple[float, tuple, int]]:
    """Each of ``tokens``' logprob under its row of ``logits`` [R, V] (the raw logits — a guided row's masked: what its
    mask ruled out (-inf) is no alternative, so fewer than n then), the row's top n (id, logprob) pairs and the token's
    rank there (1: the most likely) — R rows at once, read back once. Verify rows' emitted tokens (the rows past them
    unused), and prompt tokens each under the row before it."""
    logp = torch.log_softmax(logits[:len(tokens)].float(), dim=-1)
    chosen = logp.gather(1, to_device(tokens, torch.long, logp.device)[:, None])                     # [R, 1]
    ranks = (logp > chosen).sum(dim=-1, keepdim=True) + 1                                          # [R, 1]
    top_logp, top_ids = logp.topk(n, dim=-1) if n else (logp[:, :0], logp[:, :0])                  # [R, n] each
    # ids and ranks (< 2^53) are exact in float64: one read-back
    rows = torch.cat([chosen.double(), ranks.double(), top_ids.double(), top_logp.double()], dim=1).tolist()
    return [(row[0], tuple((int(i), v) for i, v in zip(row[2:2 + n], row[2 + n:]) if v != float("-inf")),
             int(row[1])) for row in rows]


class TokenCounts:
    """One request's token counts on the device, for its penalties: ``counts`` [2, V] int32 — every id of its history,
    and its generated ids (those after the first ``num_prompt``) — over the first ``counted`` ids of the history.

    ``of(history)`` adds the ids not yet counted (one asynchronous copy of those alone) and returns the counts;
    ``add(token)`` counts a generated id that is still on the device (sampled, not read back: the runner's
    look-ahead), the history's next one — the host appends it later, and ``of`` does not count it again."""

    def __init__(self, num_prompt: int, vocab_size: int, device: torch.device):
        self.counts = torch.zeros(2, vocab_size, dtype=torch.int32, device=device)
        self.num_prompt, self.counted = num_prompt, 0

    def of(self, history: Sequence[int]) -> Tensor:
        new = history[self.counted:]
        if new:
            assert 0 <= min(new) and max(new) < self.counts.shape[1], "history id outside the vocab"
            ids = to_device(new, torch.long, self.counts.device)
            self.counts[0].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
            generated = ids[max(0, self.num_prompt - self.counted):]
            self.counts[1].index_add_(0, generated, torch.ones_like(generated, dtype=torch.int32))
            self.counted = len(history)
        return self.counts

    def add(self, token: Tensor) -> None:
        """token: [1] on the device, the id after the last one counted (a generated one)."""
        self.counts.index_add_(1, token, torch.ones(2, 1, dtype=torch.int32, device=token.device))
        self.counted += 1


def history_counts(histories: list[Sequence[int]], num_prompt: list[int], vocab_size: int,
                   device: torch.device | str) -> Tensor:
    """``TokenCounts`` of host histories: [B, 2, V] int32 (every id of history i, those after num_prompt[i])."""
    assert len(histories) == len(num_prompt), "one num_prompt per history"
    out = []
    for hist, n in zip(histories, num_prompt):
        assert 0 <= n <= len(hist), f"num_prompt {n} outside a history of {len(hist)} ids"
        out.append(TokenCounts(n, vocab_size, torch.device(device)).of(hist))
    return torch.stack(out)


def with_drafts(counts: Tensor, drafts: Tensor) -> Tensor:
    """counts [2, V] of a history, drafts [k] (generated ids after it, on the device) → [k + 1, 2, V]: row i counts
    the history and the first i drafts (what penalties read at verification position i)."""
    k, vocab_size = drafts.shape[0], counts.shape[1]
    added = torch.zeros(k + 1, vocab_size, dtype=counts.dtype, device=counts.device)
    added[1:].scatter_(1, drafts[:, None], 1)
    return counts[None] + added.cumsum(dim=0, dtype=counts.dtype)[:, None]


def _row_values(values: list[float], device: torch.device, scalar: bool = False) -> Tensor | float:
    """One float per row as a [B, 1] column, ready to broadcast over the vocab — or, with ``scalar`` (for a product or a
    comparison, which take a Python float as the fp32 it rounds to), the one value every row has: no copy to wait on."""
    if scalar and all(v == values[0] for v in values):
        return float(torch.tensor(values[0], dtype=torch.float32))
    return to_device(values, torch.float32, device)[:, None]


def to_device(values: Sequence, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A small host list on the device without waiting for the GPU: a copy from pageable memory would wait for
    everything queued before it (the whole forward), so CUDA gets a pinned, asynchronous copy."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def has_penalties(p: SamplingParams) -> bool:
    """Whether a row's logits depend on its history (repetition, presence or frequency penalty)."""
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _check_batch(logits: Tensor, params: list[SamplingParams], counts: Tensor | None) -> None:
    assert logits.dim() == 2, f"logits must be [B, V], got shape {tuple(logits.shape)}"
    assert logits.is_floating_point(), f"logits must be floating point, got {logits.dtype}"
    num_rows = logits.shape[0]
    assert len(params) == num_rows, f"{len(params)} params for {num_rows} rows"
    assert counts is None or tuple(counts.shape) == (num_rows, 2, logits.shape[1]), \
        f"token counts of shape {tuple(counts.shape)} for {num_rows} rows of {logits.shape[1]} ids"
