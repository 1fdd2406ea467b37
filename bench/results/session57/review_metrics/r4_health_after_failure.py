"""``/health`` (the real ``OpenAIIngress.health``) over the real Coordinator (in-process, a 2-rank ProcessWorkerGroup).
Rank 1 is SIGKILLed while idle and every rebuilt generation's rank 1 fails its setup (session 56's FAULT=fail:1 hook):
the engine marks the group ``down``, ``Coordinator.check_health`` raises, every request is refused "unavailable" (the
client's 503). Expected: ``/health`` stops answering 200 (a load balancer or k8s readiness probe would take the server
out). Also checked: /health before the coordinator answers (503) and during a drain (503). Exit 1 if /health says ok
while no request can be served."""
import asyncio
import os
import signal
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "../../session56/review_faults"))
os.environ["FAULT"] = "fail:1"
from _m import check, consume, coordinator, done, greedy, prompt  # noqa: E402

import _common  # noqa: E402  (session 56's fault hook: rank 1 fails setup in rebuilt generations)

from cluster.protocol import ApiError  # noqa: E402
from cluster.serve import OpenAIIngress  # noqa: E402

if __name__ == "__main__":
    _common.install_faulty_main()
health = OpenAIIngress.__mro__[1].__dict__["health"]


class Handle:
    """A Serve handle's ``.method.remote()`` over an object in this process."""

    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        return types.SimpleNamespace(remote=lambda *a, **k: getattr(self.obj, name)(*a, **k))


class Slow:
    async def info(self):
        await asyncio.sleep(30)


async def status(ing):
    try:
        await health(ing)
        return 200
    except ApiError as e:
        return e.status


async def main():
    ing = types.SimpleNamespace(draining=False, ready=False, coord=Handle(Slow()))
    check(await status(ing) == 503, "before the coordinator answers: 503")
    c = coordinator(process=True, num_workers=2, moe="tp", comm="ipc", kv_cache_tokens=64 * 16,
                    max_num_batched_tokens=128, step_timeout_s=6.0)
    ing.coord = Handle(c)
    toks, _ = await consume(c, prompt(20, 1), greedy(4), "ok-1")
    check(len(toks) == 4 and await status(ing) == 200, "serving: 200")
    os.kill(c.group.procs[1].pid, signal.SIGKILL)
    print("SIGKILL rank 1 (idle); rebuilt generations fail their setup")
    deadline = time.monotonic() + 60
    while c.engine.down is None and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    print("engine.down:", c.engine.down)
    try:
        await c.check_health()
        hc = "passes"
    except Exception as e:  # noqa: BLE001
        hc = f"raises {type(e).__name__}: {e}"
    print("Coordinator.check_health:", hc)
    _, last = await consume(c, prompt(20, 2), greedy(4), "after")
    print("a request now:", last.finish_reason, last.refused and last.refused.reason, (last.error or "")[:100])
    h = await status(ing)
    check(not (h == 200 and last.refused is not None), f"/health while every request is refused 'unavailable': {h}")
    ing.draining = True
    check(await status(ing) == 503, "draining: 503")
    c.aengine.shutdown()
    c.group.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
    done()
