"""``_ConnGroup._collect`` has a deadline, but once a rank's answer has begun to arrive ``_recv`` reads the rest with
blocking reads (``recv_bytes`` / ``os.readv``, no timeout): a rank that stops (SIGSTOP, a hung host, a stalled network
between nodes) in the middle of sending a large answer — a prefill replica's exported KV rows (``StepResult.kv``), prompt
logprobs — holds the driver past the deadline, forever. Driven here on the real ``_collect`` / ``_recv`` / ``_send``
with a socketpair: the "rank" end sends the framing of a ("ok", result) message with an 8 MB out-of-band buffer, then
half the buffer, then stops writing (alive, connection open).
Exit 1 if ``_collect(3.0, ...)`` has not returned or raised 10 s later."""
import os
import pickle
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import *  # noqa: F401,F403


def main() -> int:
    import numpy as np
    from multiprocessing import connection as mp_connection

    from cluster.workers import _ConnGroup

    a, b = socket.socketpair()
    driver, rank = mp_connection.Connection(a.detach()), mp_connection.Connection(b.detach())
    group = _ConnGroup()
    group.conns = [driver]
    payload = np.zeros(8 << 20, dtype=np.uint8)

    def stuck_rank():
        buffers = []
        head = pickle.dumps(("ok", payload), protocol=5, buffer_callback=buffers.append)
        views = [buf.raw() for buf in buffers]
        rank.send_bytes(struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views)) + head)
        half = views[0][: views[0].nbytes // 2]
        while half.nbytes:
            half = half[os.write(rank.fileno(), half):]
        log("rank: sent the header and half of the 8 MB buffer; now stuck")
        time.sleep(3600)

    threading.Thread(target=stuck_rank, daemon=True).start()
    out = {}

    def collect_():
        t = time.monotonic()
        try:
            group._collect(3.0, "step")
            out["r"] = "returned"
        except BaseException as e:
            out["r"] = f"{type(e).__name__}: {e}"
        out["t"] = time.monotonic() - t

    th = threading.Thread(target=collect_, daemon=True)
    th.start()
    th.join(10)
    if th.is_alive():
        import traceback

        where = "".join(traceback.format_stack(sys._current_frames()[th.ident])[-2:])
        log("_collect(3.0) still blocked after 10 s in:\n" + where)
    else:
        log(f"_collect ended after {out['t']:.1f}s: {out['r']}")
    bad = th.is_alive()
    log("result:", "problem present: a partial answer holds the driver past the deadline" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    os._exit(main())
