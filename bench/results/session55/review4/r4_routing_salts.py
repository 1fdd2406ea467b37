"""r4: prefix-affinity routing between Coordinator replicas (cluster/routing.py) keys a prompt by its cache salt: a
salted prompt is routed to where its own salt's prefix went, never to where another salt's (or the unsalted) prompt
went; the router reads the salt from both ``generate`` and ``prefill`` calls."""
import types

from common import SamplingParams, check, done, ids

from cluster.routing import PrefixAffinity, _prompt

aff = PrefixAffinity(span=16)
P = ids(100, 31)
q = {"r1": 0, "r2": 0, "r3": 0}
aff.record(P, "r1", salt="A")
check(aff.prefer(P, q, "A") == "r1", "salt A's repeat goes to A's replica")
check(aff.prefer(P, q, "B") is None and aff.prefer(P, q) is None, "salt B / unsalted prompts get no preference from A's")
aff.record(P, "r2")
check(aff.prefer(P, q, "A") == "r1" and aff.prefer(P, q) == "r2", "the unsalted prompt's record does not move A's")
check(set(aff.keys(P, "A")).isdisjoint(aff.keys(P)) and set(aff.keys(P, "A")).isdisjoint(aff.keys(P, "B")),
      "the keys of one prompt under A, B and no salt are disjoint")
check(len(aff.keys(P[:33])) == 2 and len(aff.keys(P[:32])) == 1, "only spans before the last token are keys")


def pending(method, args):
    return types.SimpleNamespace(metadata=types.SimpleNamespace(call_method=method), args=args)


p = SamplingParams(max_tokens=2, cache_salt="A")
check(_prompt(pending("generate", (P, p, "rid"))) == (P, "A"), "generate's salt is read")
check(_prompt(pending("prefill", (P, p, "rid", 32))) == (P, "A"), "prefill's salt is read")
check(_prompt(pending("generate", (P, SamplingParams(max_tokens=2), "rid"))) == (P, None), "no salt: None")
check(_prompt(pending("abort", ("rid",))) is None, "other methods are not routed by prefix")
done()
