"""r15: prefix affinity of rank placement for a prompt whose cached blocks are HELD by a running request — the front
end's n > 1 path (cluster/serve.py: the other choices are added once the first has its first token, "they find the
prompt's blocks cached") and concurrent turns sharing a system prompt. Engine.add_request places by
``kv_load - hits``; the holder's kv_load already counts the held blocks (pool.num_used), so subtracting the hits only
brings it level with an empty rank, and the tie goes to the lowest rank. In a 2-rank group (real processes) the lead
of an n = 4 request lands on rank 0; the 3 other choices: where do they go, and how many prompt tokens hit?
Single process for contrast. Exits 1 when a choice is placed on a rank without the prompt's blocks while the holder
has a free seat and blocks."""
import sys
from _common import Group, Timer, config, greedy, prompts, run, single


def share(eng, prompt, n):
    """serve's share path: the lead first; the other choices once it has its first token."""
    eng.add_request(prompt, greedy(8), "c0")
    while not any(ev.token_ids for ev in eng.step()):
        pass
    holder = eng._rank_of["c0"]
    seats = [s.free_seats for s in eng.schedulers]
    cached = [s.cached_blocks(prompt) for s in eng.schedulers]
    for i in range(1, n):
        eng.add_request(prompt, greedy(8), f"c{i}")
    placed = {rid: r for rid, r in eng._rank_of.items()}
    while eng.has_work():
        eng.step()
    return holder, seats, cached, placed


def main():
    prompt = prompts(1, 100, 101, seed=61)[0]
    s = single(config(1))
    share(s, prompt, 4)
    print(f"single: prompt tokens queried/hit {s.prefix_cache_tokens()}")
    missed = []
    for n in (2, 4):
        with Timer(f"{n} ranks"), Group(config(n, comm="ipc")) as eng:
            holder, seats, cached, placed = share(eng, prompt, 4)
            print(f"{n} ranks: lead on rank {holder}; before the others: free seats {seats}, cached blocks of the prompt "
                  f"per rank {cached}")
            print(f"  placed {placed}")
            print(f"  prompt tokens queried/hit per rank {[(x.prefix_queried, x.prefix_hits) for x in eng.schedulers]}; "
                  f"total {eng.prefix_cache_tokens()}")
            missed += [f"{n} ranks: {rid}" for rid, r in placed.items() if rid != "c0" and r != holder]
    print(f"choices placed away from the prompt's blocks: {missed}")
    print("RESULT:", "FAIL" if missed else "OK")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
