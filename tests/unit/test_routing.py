"""Prefix affinity across Coordinator replicas (cluster/routing.py): the policy, without Ray Serve (the router in front of
Serve's routing is exercised by tests/integration/test_serve.py's two-replica test)."""

from __future__ import annotations

from cluster.routing import PrefixAffinity


def test_a_prompt_goes_to_the_replica_that_took_its_longest_prefix():
    aff = PrefixAffinity(span=4)
    system = list(range(100, 112))                               # three spans
    aff.record(system + [1, 2, 3], "a")
    aff.record(system[:8] + [7] * 9, "b")                        # shares two spans with the first
    idle = {"a": 0, "b": 0, "c": 0}
    assert aff.prefer(system + [9, 9, 9, 9, 9], idle) == "a"     # three spans in common with a's, two with b's
    assert aff.prefer(system[:8] + [7] * 5, idle) == "b"         # b took the same two spans last
    assert aff.prefer([5] * 20, idle) is None                    # nothing known: Serve's own choice
    assert aff.prefer(system[:4], idle) is None                  # no whole span before the last token
    assert aff.prefer(system + [9, 9, 9, 9, 9], {"b": 0, "c": 0}) == "b"    # a is gone: the next longest


def test_a_busy_replica_loses_its_prompts_and_a_dead_one_is_forgotten():
    aff = PrefixAffinity(span=4, imbalance=8)
    ids = list(range(40))
    aff.record(ids, "a")
    assert aff.prefer(ids, {"a": 9, "b": 1}) == "a"
    assert aff.prefer(ids, {"a": 10, "b": 1}) is None            # 9 more than the least busy
    assert aff.prefer(ids, {"a": None, "b": 1}) == "a"           # its queue unknown: still preferred
    assert aff.prefer(ids, {"a": 9, "b": None}) is None          # the other's unknown (Serve forgot it): idle
    aff.forget("a")
    assert aff.prefer(ids, {"a": 0, "b": 0}) is None


def test_the_memory_of_prefixes_is_bounded_least_recent_first():
    aff = PrefixAffinity(span=2, max_keys=6)
    aff.record(list(range(10)), "a")                             # 4 points (the last span needs a token after it)
    aff.record(list(range(50, 60)), "b")                         # 4 more: a's two oldest are forgotten
    assert aff.prefer(list(range(60, 70)), {"a": 0, "b": 0}) is None
    assert aff.prefer(list(range(50, 60)), {"a": 0, "b": 0}) == "b"
    assert aff.prefer(list(range(10)), {"a": 0, "b": 0}) == "a"   # its longer points are still known
    assert aff.prefer(list(range(3)) + [99] * 7, {"a": 0, "b": 0}) is None


def test_a_salted_prompt_is_known_apart_from_the_same_prompt_unsalted():
    aff = PrefixAffinity(span=4)
    ids = list(range(20))
    aff.record(ids, "a")
    aff.record(ids, "b", salt="t1")
    assert aff.prefer(ids, {"a": 0, "b": 0}) == "a" and aff.prefer(ids, {"a": 0, "b": 0}, salt="t1") == "b"
    assert aff.prefer(ids, {"a": 0, "b": 0}, salt="t2") is None
