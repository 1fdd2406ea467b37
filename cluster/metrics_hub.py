"""Every Coordinator replica's metrics at one ``/metrics``: a Serve handle reaches one replica a call, so each replica
leaves its metrics text with a small named actor of the app (``MetricsHub``) at each health check (Serve's period,
10 s by default), and the ingress answers with the replica it reached (fresh) and the others' last texts, each sample
labelled with its ``replica``. A replica that stops reporting drops out after ``MAX_AGE_S``. The ingress replicas
leave theirs too: every HTTP answer by route and status (``HttpCounts``: its own 400s, 404s and 503s, which no
coordinator sees)."""

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


_http = None       # this process's HTTP answers (counter, registry): made at the first (a registry does not pickle)


def _http_counts():
    global _http
    if _http is None:
        from prometheus_client import CollectorRegistry, Counter

        registry = CollectorRegistry()
        _http = Counter("glmserve_http_requests", "HTTP answers of an ingress replica by route and status (the "
                        "ingress's own refusals included)", ["route", "status"], registry=registry), registry
    return _http


def http_text() -> str:
    """This process's HTTP answer counts as Prometheus text ("" before its first answer)."""
    from prometheus_client import generate_latest

    return generate_latest(_http[1]).decode() if _http is not None else ""


class HttpCounts:
    """ASGI middleware: each answer counted as it starts, by the route that took it (its path template; "other" for
    none: an unknown path must not add series) and its status — a stream is counted once, with its 200."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":
                _http_counts()[0].labels(_route(scope), str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)


def _route(scope) -> str:
    """The path template of the route that took the request (FastAPI's routing leaves it in the scope), else "other"."""
    return getattr(scope.get("route"), "path", None) or "other"


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
