"""r3: disaggregated prefill under salts, on real engines (tiny model, CPU): ``hold_prefix`` finds only the request's
salt's prefix (device and host tier), ``adopt_bundle`` files the transferred blocks under that salt, the decode's
tokens equal an uncached engine's, ``Coordinator._asked`` dedups in-flight asks within one salt only, and
``Coordinator._prefilled`` never sends a prompt-logprobs request to the prefill tier."""
import asyncio

from cluster.disagg import prefill_params
from common import SamplingParams, check, done, engine, ids, run
from scheduler.block_pool import root

G = lambda salt=None, n=6: SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, cache_salt=salt)  # noqa


def prefill(eng, prompt, params, rid, start=0):
    eng.add_request(prompt, prefill_params(params), rid, export_kv=True, export_from=start)
    bundle = None
    while eng.has_work():
        for ev in eng.step():
            assert ev.error is None, ev.error
            bundle = ev.kv or bundle
    return bundle


def decode(eng, prompt, params, bundle, rid):
    eng.add_request(prompt, params, rid, kv=bundle)
    out, cached = [], None
    while eng.has_work():
        for ev in eng.step():
            assert ev.error is None, ev.error
            out += ev.token_ids
            cached = ev.num_cached_tokens
    return out, cached


ref = engine(kv_tokens=1024, caching=False, max_len=256)
pre = engine(kv_tokens=1024, max_len=256)
dec = engine(kv_tokens=512, host=2048, max_len=256)
pool = dec.scheduler.pool
P = ids(100, 21)
want = run(ref, {"r": (P, G())})["r"]["tokens"]

held = dec.hold_prefix(P, "A")
check(held.start == 0, f"nothing held before A's first turn ({held.start})")
held.release()
bundle = prefill(pre, P, G("A"), "pA")
got, cached = decode(dec, P, G("A"), bundle, "dA")
check(got == want, "A's transferred prompt decodes to the uncached tokens")
for salt, start in (("A", 96), ("B", 0), (None, 0)):
    held = dec.hold_prefix(P, salt)
    check(held.start == start, f"hold_prefix(P, {salt!r}).start == {start} (got {held.start})")
    held.release()
check(pool.match(P) == [] and pool.match(P, root("B")) == [], "the adopted blocks are under A's root only")

# B's prefill replica run: the prefill replica caches under B; its second ask finds B's prefix there only
bundleB = prefill(pre, P, G("B"), "pB")
check(pre.prefix_cache_tokens()[1] == 0, f"the prefill engine found nothing cached for B ({pre.prefix_cache_tokens()[1]})")
got, _ = decode(dec, P, G("B"), bundleB, "dB")
check(got == want, "B's transferred prompt decodes to the uncached tokens")
check(len(pool.match(P, root("A"))) == 6 and len(pool.match(P, root("B"))) == 6 and
      not set(pool.match(P, root("A"))) & set(pool.match(P, root("B"))), "A's and B's adopted chains are distinct")

# A's next turn: held past A's prefix, the rest asked for; the same after the device forgot A's prefix (host tier)
P2 = P + want + ids(40, 22)
want2 = run(ref, {"r": (P2, G())})["r"]["tokens"]
held = dec.hold_prefix(P2, "A")
start = held.start
check(start >= 96, f"A's next turn holds A's prefix ({start} tokens)")
b2 = prefill(pre, P2, G("A"), "pA2", start)
got, cached = decode(dec, P2, G("A"), b2, "dA2")
held.release()
check(got == want2, "A's next turn (held prefix + transferred rest) decodes to the uncached tokens")
for i in range(6):
    run(dec, {f"fill{i}": (ids(200, 300 + i), G(n=2))})
check(all(pool.block(n) is None for n in pool.match(P, root("A"))), "A's prefix is on the host tier only now")
heldA, heldN = dec.hold_prefix(P2, "A"), dec.hold_prefix(P2, None)
check(heldA.start >= 96 and heldN.start == 0, f"host tier: A holds {heldA.start}, unsalted holds {heldN.start}")
b3 = prefill(pre, P2, G("A"), "pA3", heldA.start)
got, _ = decode(dec, P2, G("A"), b3, "dA3")
heldA.release()
heldN.release()
check(got == want2, "A's turn from the host tier + transfer decodes to the uncached tokens")

# the coordinator's ask bookkeeping
import types  # noqa: E402

from cluster.coordinator import Coordinator  # noqa: E402

calls = []


def remote(ids_, params, req_id, start):
    calls.append(req_id)

    class Stream:
        async def __anext__(self):
            await asyncio.sleep(60)

        def cancel(self):
            pass
    return Stream()


handle = types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(prefill=types.SimpleNamespace(remote=remote)))
counter = types.SimpleNamespace(labels=lambda r: types.SimpleNamespace(inc=lambda: None), inc=lambda: None)
stub = types.SimpleNamespace(prefill_tier=handle, min_prefill_tokens=0, prefill_paused_until=0.0, engine=dec,
                             sched_config=dec.config, metrics=types.SimpleNamespace(local_prompts=counter,
                                                                                    kv_lost=counter),
                             _asking={}, prefill_block=0)
for f in (Coordinator._asked, Coordinator._ask, Coordinator._asked_end, Coordinator._worth_asking,
          Coordinator._prefilled):
    setattr(stub, f.__name__, types.MethodType(f, stub))
Q = ids(120, 23)
stub._ask("x", Q, "A")
check(stub._asked(Q, "A", 0) is not None, "a second salt-A request waits on A's in-flight ask")
check(stub._asked(Q, "B", 0) is None and stub._asked(Q, None, 0) is None, "salt B / unsalted do not wait on A's ask")
stub._asked_end("x")
res = asyncio.run(stub._prefilled(Q, SamplingParams(max_tokens=2, prompt_logprobs=1, cache_salt="A"), "pl"))
check(res == (None, None) and calls == [], f"a prompt-logprobs request is not sent to the prefill tier ({calls})")
check(dec.num_free_blocks() == 32 and not pool._pins, f"no holds or pins left ({dec.num_free_blocks()}, {dict(pool._pins)})")
done()
