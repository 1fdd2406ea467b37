"""Every Coordinator replica's metrics at one ``/metrics``: a Serve handle reaches one replica a call, so each replica
leaves its metrics text with a small named actor of the app (``MetricsHub``) at each health check (Serve's period,
10 s by default), and the ingress answers with the replica it reached (fresh) and the others' last texts, each sample
labelled with its ``replica``. A replica that stops reporting drops out after ``MAX_AGE_S``."""

from __future__ import annotations

import re
import time

import ray

MAX_AGE_S = 60.0        # a replica's text older than this is gone (the replica with it)
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?(\s.*)")


@ray.remote(num_cpus=0)
class MetricsHub:
    """The replicas' last metrics texts, by replica id."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[float, str]] = {}

    def put(self, replica: str, text: str) -> None:
        self.texts[replica] = (time.monotonic(), text)

    def get(self) -> dict[str, str]:
        now = time.monotonic()
        self.texts = {r: (t, text) for r, (t, text) in self.texts.items() if now - t < MAX_AGE_S}
        return {r: text for r, (_, text) in self.texts.items()}


def app_metrics_hub():
    """The hub of the Serve app this replica serves (created by whichever replica asks first; if its owner dies, the
    next to ask makes another); None outside Serve."""
    try:
        from ray import serve

        app = serve.get_replica_context().app_name
        return MetricsHub.options(name=f"glmserve-metrics:{app}", namespace="glmserve", get_if_exists=True).remote()
    except Exception:    # noqa: BLE001 — no Serve replica here (a Coordinator driven directly): its own metrics only
        return None


def merge(texts: dict[str, str]) -> str:
    """The replicas' Prometheus texts as one: each family's HELP and TYPE once, then every replica's samples of it, a
    ``replica`` label added to each."""
    families: dict[str, list[str]] = {}
    for replica, text in sorted(texts.items()):
        family = None
        for line in text.splitlines():
            if line.startswith("# "):
                parts = line.split(maxsplit=3)
                family = parts[2] if len(parts) > 2 else family
                head = families.setdefault(family, [])
                if line not in head:
                    head.insert(sum(h.startswith("# ") for h in head), line)
                continue
            m = _SAMPLE.fullmatch(line)
            if m is None or family is None:
                continue
            name, labels, rest = m.groups()
            labels = f'replica="{replica}"' + (f",{labels}" if labels else "")
            families[family].append(f"{name}{{{labels}}}{rest}")
    return "".join(line + "\n" for lines in families.values() for line in lines)
