"""r8: rank balance of the placement (Engine.add_request -> place_request by KV load) as requests come and go, on the
real Engine and per-rank Schedulers with a fake executor (every row samples token 50; no model: policy only).
Scenario: a long prompt with a short answer arrives first, then 24 short chats with long answers. KV-load placement
puts every short chat on the other rank (their prompts' blocks never reach the long prompt's), the long one ends after
4 tokens, and from then on one rank decodes 24 requests while the other idles for ~200 steps: each dp step's bucket
is 32 rows a rank (the MoE gathers 2 x 32 rows) where 16 would do. Running requests never move (``_rebalance`` moves
only waiting ones). Exits 1 when a rank sits idle for >= 50 steps while another runs >= 8 requests."""
import sys
from _common import config, TINY
from cluster.engine import Engine
from cluster.local import scheduler_config
from models.config import ModelConfig
from scheduler.request import SamplingParams
from workers.runner import StepResult


class Fake:
    def execute(self, steps):
        return [StepResult(st.step_id, {s.req_id: [50] for s in st.seqs if s.sample}) for st in steps]

    def recover(self):
        pass


def main():
    cfg = config(2, kv_cache_tokens=128 * 16, max_num_seqs=64, max_num_batched_tokens=512)
    sched = scheduler_config(cfg, ModelConfig.from_json(TINY), None, cfg.num_blocks)
    eng = Engine(Fake(), sched, num_ranks=2)
    p = lambda n: SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    eng.add_request(list(range(100, 1100)), p(4), "long")
    for i in range(24):
        eng.add_request([200 + i] * 8, p(200), f"chat{i}")
    placed = dict(eng._rank_of)
    print("placement:", {r: sorted(k for k, v in placed.items() if v == r) for r in (0, 1)})
    idle_run = worst = 0
    rows_used = rows_balanced = 0
    history = []
    first_pre = None
    while eng.has_work():
        before = eng.stats["preemptions"]
        eng.step()
        if eng.stats["preemptions"] > before and first_pre is None:
            first_pre = (len(history), [x.pool.num_free for x in eng.schedulers],
                         [x.num_running for x in eng.schedulers])
        live = [s.num_running + s.num_waiting for s in eng.schedulers]
        history.append(live)
        if min(live) == 0 and max(live) >= 8:
            idle_run += 1
            worst = max(worst, idle_run)
        else:
            idle_run = 0
        total = sum(live)
        if total:
            rows_used += 2 * (1 << max(max(live) - 1, 0).bit_length())
            rows_balanced += 2 * (1 << max(-(-total // 2) - 1, 0).bit_length())
    print(f"live per rank, every 25th step: {history[::25]}")
    print(f"longest stretch with one rank idle and the other running >= 8: {worst} steps; moves {eng.stats['moves']}")
    print(f"preemptions {eng.stats['preemptions']}; the first at step {first_pre and first_pre[0]} with free blocks "
          f"per rank {first_pre and first_pre[1]} and running per rank {first_pre and first_pre[2]}")
    print(f"MoE rows gathered over the run: {rows_used} (balanced placement: {rows_balanced}, "
          f"{rows_used / rows_balanced:.2f}x)")
    bad = worst >= 50 or (first_pre is not None and max(first_pre[1]) > 64)
    print("RESULT:", "FAIL (imbalance)" if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
