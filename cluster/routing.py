"""Prefix affinity across Coordinator replicas: a prompt goes to the replica that last took a prompt starting as it
does, so that replica's prefix cache (scheduler/block_pool.py) holds its KV — a conversation's next turn, or another
user of the same system prompt — unless that replica is busier than the least busy one by more than a margin.

``PrefixAffinity`` is the policy (pure: hashes of the prompt's leading spans, an LRU of which replica took each);
``PrefixAffinityRouter`` puts it in front of Ray Serve's routing for the ``Coordinator`` deployment (``build_app``): it
runs in each caller (an ingress replica) and learns from the requests that caller routed.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

SPAN = 128            # tokens between the prefix points a prompt is known by
MAX_KEYS = 200_000    # prefix points remembered (the least recently routed are forgotten)
IMBALANCE = 8         # requests a preferred replica may have beyond the least busy one before a prompt goes elsewhere


class PrefixAffinity:
    """Which replica a prompt's longest remembered prefix went to. A prompt is known by chained hashes of its leading
    ``span``-token spans (only whole spans before its last token: what a cached prefix can cover), chained from its
    ``cache_salt`` (a salted prompt's cached prefix is its salt's only)."""

    def __init__(self, span: int = SPAN, max_keys: int = MAX_KEYS, imbalance: int = IMBALANCE) -> None:
        self.span, self.max_keys, self.imbalance = span, max_keys, imbalance
        self._owner: OrderedDict[int, Hashable] = OrderedDict()

    def keys(self, ids: Sequence[int], salt: str | None = None) -> list[int]:
        out, h = [], 0 if salt is None else hash(("salt", salt))
        for end in range(self.span, len(ids), self.span):
            h = hash((h, tuple(ids[end - self.span:end])))
            out.append(h)
        return out

    def prefer(self, ids: Sequence[int], queue: dict[Hashable, int | None], salt: str | None = None) -> Hashable | None:
        """The replica among ``queue``'s (replica -> requests it holds, None: unknown) that took the longest prefix of
        ``ids``; None if none did, or if it holds ``imbalance`` more requests than the least busy. A replica whose
        count is unknown counts as idle: Serve forgets a count after 10 s, and refreshes it only where it routes by
        its own choice — ignoring those, one replica took every prompt of a shared head after a lull (session 59)."""
        for key in reversed(self.keys(ids, salt)):
            replica = self._owner.get(key)
            if replica in queue:
                mine = queue[replica]
                if mine is not None and mine - min(q or 0 for q in queue.values()) > self.imbalance:
                    return None
                return replica
        return None

    def record(self, ids: Sequence[int], replica: Hashable, salt: str | None = None) -> None:
        for key in self.keys(ids, salt):
            self._owner[key] = replica
            self._owner.move_to_end(key)
        while len(self._owner) > self.max_keys:
            self._owner.popitem(last=False)

    def forget(self, replica: Hashable) -> None:
        for key in [k for k, r in self._owner.items() if r == replica]:
            del self._owner[key]


def _prompt(pending: PendingRequest | None) -> tuple[Sequence[int], str | None] | None:
    """The prompt ids and cache salt of a ``Coordinator.generate(ids, params, req_id, ...)`` or ``prefill`` call; None
    for the other methods."""
    if pending is None or pending.metadata.call_method not in ("generate", "prefill") or not pending.args:
        return None
    ids = pending.args[0]
    salt = getattr(pending.args[1], "cache_salt", None) if len(pending.args) > 1 else None
    return (ids, salt) if isinstance(ids, (list, tuple)) else None


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Ray Serve's request router for the Coordinator: the replica ``PrefixAffinity`` prefers first, then two random
    ones (power of two choices, as Serve's default) — the least busy of a rank with room takes the request."""

    def initialize_state(self, span: int = SPAN, max_keys: int = MAX_KEYS, imbalance: int = IMBALANCE, **_) -> None:
        self.affinity = PrefixAffinity(span, max_keys, imbalance)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        two = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        prompt = _prompt(pending_request)
        if prompt is None or len(candidate_replicas) < 2:
            return [two]
        by_id = {r.replica_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        chosen = self.affinity.prefer(prompt[0], {rid: cache.get(rid) for rid in by_id}, prompt[1])
        return [[by_id[chosen]], two] if chosen is not None else [two]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        prompt = _prompt(pending_request)
        if prompt is not None:
            self.affinity.record(prompt[0], replica_id, prompt[1])

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.affinity.forget(replica_id)
