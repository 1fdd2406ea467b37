import sys
sys.argv = ["x"]
sys.path.insert(0, "/work/main/bench/results/session59/review_kvcache")
import fuzz_kv, random
orig = fuzz_kv.draw
def draw(rng):
    c = orig(rng)
    c["bs"] = rng.choice([1, 2, 3])
    c["blocks"] = rng.randrange(96 // c["bs"] + 1, 2 * 96 // c["bs"])
    c["host"] = rng.choice([0, 10, 60])
    return c
fuzz_kv.draw = draw
bad = 0
for wl in range(8):
    c, reqs, problems, stats = fuzz_kv.workload(77, wl)
    print(wl, c, stats, problems or "OK", flush=True)
    bad += bool(problems)
print("bad", bad)
