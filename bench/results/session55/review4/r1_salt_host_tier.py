"""r1: salt isolation and reuse correctness on the real engine (tiny model, CPU) with a host tier.

A prompt cached under salt A (or none) must be found only under that salt — counted in cached_tokens only there —
and a prefix evicted from the device to the host tier, loaded back and reused must give the greedy tokens of an
engine without a cache. Blocks cached for two salts must be distinct nodes and distinct device blocks / host slots."""
from common import SamplingParams, check, done, engine, ids, run

G = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
S = lambda s: SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, cache_salt=s)  # noqa: E731

ref = engine(kv_tokens=512, caching=False, max_len=256)
eng = engine(kv_tokens=512, host=2048, max_len=256)     # 32 device blocks, 128 host blocks
P = ids(100, 1)
want = run(ref, {"r": (P, G)})["r"]["tokens"]
pool = eng.scheduler.pool

seq = [("a1", "A", 0), ("a2", "A", 96), ("b1", "B", 0), ("n1", None, 0), ("n2", None, 96), ("b2", "B", 96)]
for rid, salt, cached in seq:
    got = run(eng, {rid: (P, S(salt) if salt else G)})[rid]
    check(got["tokens"] == want, f"{rid} (salt {salt}) tokens == uncached engine's")
    check(got["cached"] == cached, f"{rid} (salt {salt}) cached_tokens {got['cached']} == {cached}")

# the three chains: distinct nodes, distinct device blocks / host slots
from scheduler.block_pool import root  # noqa: E402
chains = {s: pool.match(P, root(s)) for s in ("A", "B", None)}
check(all(len(c) == 6 for c in chains.values()), f"each salt holds its own 6 blocks: {[len(c) for c in chains.values()]}")
nodes = [n for c in chains.values() for n in c]
check(len(set(nodes)) == len(nodes), "no node shared by two salts")
blocks = [pool.block(n) for n in nodes if pool.block(n) is not None]
check(len(set(blocks)) == len(blocks), "no device block shared by two salts")
slots = [pool._nodes[n].slot for n in nodes if pool._nodes[n].slot is not None]
check(len(set(slots)) == len(slots), "no host slot shared by two salts")

# fill the device with other prompts: P's blocks go to the host tier only
for i in range(6):
    run(eng, {f"fill{i}": (ids(200, 100 + i), G)})
on_device = [pool.block(n) for n in chains["A"]]
print("salt A's device blocks after the fill:", on_device)
check(all(b is None for b in on_device), "salt A's prefix evicted from the device (host copies only)")
loads = eng.scheduler.host_loads
for rid, salt, cached in [("a3", "A", 96), ("c1", "C", 0), ("n3", None, 96), ("b3", "B", 96)]:
    got = run(eng, {rid: (P, S(salt) if salt else G)})[rid]
    check(got["tokens"] == want, f"{rid} (salt {salt}) after host reload: tokens == uncached engine's")
    check(got["cached"] == cached, f"{rid} (salt {salt}) after host reload: cached_tokens {got['cached']} == {cached}")
check(eng.scheduler.host_loads > loads, f"the reuse loaded from the host tier ({eng.scheduler.host_loads - loads} loads)")

# two salts at once, same prompt, same step: no aliasing, each equals the reference
P2 = ids(150, 2)
want2 = run(ref, {"r": (P2, G)})["r"]["tokens"]
got = run(eng, {"x": (P2, S("X")), "y": (P2, S("Y")), "z": (P2, G)})
check(all(got[r]["tokens"] == want2 for r in "xyz"), "three salts in one batch: tokens == uncached engine's")
check(all(got[r]["cached"] == 0 for r in "xyz"), f"three salts in one batch: none cached {[got[r]['cached'] for r in 'xyz']}")
got = run(eng, {"x2": (P2, S("X")), "y2": (P2, S("Y"))})
check(all(got[r]["cached"] == 144 for r in ("x2", "y2")), "each salt then finds its own 9 blocks")
done()
