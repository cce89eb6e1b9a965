"""The fleet page's data: instances and their state, throughput and tool-call latency.

Three sources, any combination:

* instances the UI knows by URL (started by ``awm ui --serve ENV`` as a LocalFleet, or given with
  ``--instance MCP_URL,CONTROL_URL``): their ``/readyz`` and their Prometheus ``/metrics``,
  scraped on every poll; rates are the counters' change between two polls;
* an operator's allocation API (``--operator-url`` and ``--fleet NAMESPACE/NAME``): replicas, ready,
  allocated and starting instances per EnvFleet; with ``--namespace NAMESPACE``, every Campaign
  (phase, step, reward, pass rates, its fleet's counts) and every EnvFleet (counts, why it is not
  ready) there, which is what the chart's UI (charts/awm, ``ui.enabled``) shows in a cluster;
* a Prometheus server (``--prometheus-url``): episodes/s and tool-call latency of the whole fleet,
  the same expressions as the chart's Grafana dashboard (charts/awm/files/awm-dashboard.json).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

# the operator API's credentials (AWM_API_TOKEN or the pod's token); that module needs only httpx
from awm.claims import FleetInstances
from awm.episode.allocation import bearer

PROMQL = {  # fleet-wide, from a real Prometheus (checked by promtool in tests/test_ui_dashboard.py)
    "episodes_per_s": "sum(rate(awm_episodes_total[1m]))",
    "tool_calls_per_s": "sum(rate(awm_tool_calls_total[1m]))",
    "tool_p50_s": "histogram_quantile(0.5, sum by (le) (rate(awm_tool_call_seconds_bucket[1m])))",
    "tool_p99_s": "histogram_quantile(0.99, sum by (le) (rate(awm_tool_call_seconds_bucket[1m])))",
}


UNKNOWN = "?"  # the environment of an instance given by URL, until it answers /info
# A namespace's Campaigns and EnvFleets are listed at most this often, however many pages poll
# (each listing is two LISTs on the API server, through the operator).
LIST_TTL_S = 1.5


class Instance(BaseModel):
    env: str
    name: str
    mcp_url: str
    control_url: str


class Counters(BaseModel):
    """What one scrape of an instance's /metrics says (cumulative since it started)."""

    episodes: float = 0.0
    tool_calls: float = 0.0
    tool_errors: float = 0.0
    tool_seconds: float = 0.0
    buckets: dict[float, float] = {}  # tool-call latency histogram: upper bound -> cumulative count


def parse_metrics(text: str) -> Counters:
    c = Counters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "awm_episodes_total":
                c.episodes += sample.value
            elif sample.name == "awm_tool_calls_total":
                c.tool_calls += sample.value
                if sample.labels.get("outcome") not in (None, "ok"):
                    c.tool_errors += sample.value
            elif sample.name == "awm_tool_call_seconds_sum":
                c.tool_seconds += sample.value
            elif sample.name == "awm_tool_call_seconds_bucket":
                bound = float(sample.labels["le"])
                c.buckets[bound] = c.buckets.get(bound, 0.0) + sample.value
    return c


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """A quantile from cumulative histogram buckets, interpolated as Prometheus does."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank, lower, below = q * buckets[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


def _delta(now: Counters, then: Counters | None) -> Counters:
    if then is None or now.tool_calls < then.tool_calls:  # first poll, or the instance restarted
        return Counters(buckets={})
    return Counters(episodes=now.episodes - then.episodes, tool_calls=now.tool_calls - then.tool_calls,
                    tool_errors=now.tool_errors - then.tool_errors, tool_seconds=now.tool_seconds - then.tool_seconds,
                    buckets={b: v - then.buckets.get(b, 0.0) for b, v in now.buckets.items()})


class FleetView:
    """Polled by the fleet page; remembers the previous scrape of each instance for rates."""

    def __init__(self, instances: list[Instance] | None = None, operator_url: str | None = None,
                 fleets: list[str] | None = None, prometheus_url: str | None = None,
                 grafana_url: str | None = None, namespaces: list[str] | None = None) -> None:
        self.instances = list(instances or [])
        self.operator_url = operator_url.rstrip("/") if operator_url else None
        self.fleets = list(fleets or [])
        self.namespaces = list(namespaces or [])
        self._listed: dict[str, tuple[float, dict[str, Any]]] = {}  # namespace -> (when, listing)
        self.prometheus_url = prometheus_url.rstrip("/") if prometheus_url else None
        self.grafana_url = grafana_url
        self.holders: dict[str, str] = {}  # instance name -> who holds it here (the playground)
        self._last: dict[str, tuple[float, Counters]] = {}
        self._client = httpx.AsyncClient(timeout=5.0)

    async def _instance(self, inst: Instance) -> dict[str, Any]:
        state, counters = "down", None
        try:
            if inst.env == UNKNOWN:  # given by URL (--instance): the instance says what it serves
                info = (await self._client.get(inst.control_url.rstrip("/") + "/info")).json()
                inst.env, inst.name = info.get("env") or UNKNOWN, info.get("instance") or inst.name
            ready = await self._client.get(inst.control_url.rstrip("/") + "/readyz")
            state = "ready" if ready.status_code == 200 else "not_ready"
            counters = parse_metrics((await self._client.get(inst.control_url.rstrip("/") + "/metrics")).text)
        except httpx.HTTPError:
            pass
        now = time.monotonic()
        out: dict[str, Any] = {**inst.model_dump(), "state": state, "holder": self.holders.get(inst.name)}
        if counters is not None:
            previous = self._last.get(inst.name)
            delta = _delta(counters, previous[1] if previous else None)
            elapsed = now - previous[0] if previous else 0.0
            self._last[inst.name] = (now, counters)
            out.update(episodes=counters.episodes, tool_calls=counters.tool_calls,
                       episodes_per_s=round(delta.episodes / elapsed, 3) if elapsed else None,
                       tool_calls_per_s=round(delta.tool_calls / elapsed, 3) if elapsed else None,
                       tool_p50_ms=_ms(quantile(counters.buckets, 0.5)),
                       tool_p99_ms=_ms(quantile(counters.buckets, 0.99)),
                       tool_mean_ms=_ms(counters.tool_seconds / counters.tool_calls if counters.tool_calls else None),
                       tool_errors=counters.tool_errors, _buckets=counters.buckets)
        return out

    async def _operator(self, ref: str) -> dict[str, Any]:
        """An EnvFleet's counts, its instances (environment, state, claim, holder) and its claims."""
        namespace, _, name = ref.partition("/")
        url = f"{self.operator_url}/v1/namespaces/{namespace}/envfleets/{name}"
        try:
            response, listed = await asyncio.gather(self._client.get(url, headers=bearer()),
                                                    self._client.get(url + "/instances", headers=bearer()))
            body = response.json()
            detail = FleetInstances.read(listed.json()) if listed.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:  # (BadRequest: an answer that is not FleetInstances)
            return {"fleet": ref, "error": str(exc)}
        if response.status_code != 200:
            return {"fleet": ref, "error": body.get("error", response.text)}
        by_env: dict[str, dict[str, int]] = {}
        for inst in detail.instances if detail else []:
            states = by_env.setdefault(inst.environment, {})
            states[inst.state] = states.get(inst.state, 0) + 1
        listing = detail.wire() if detail else {"instances": [], "claims": []}
        return {**body, "environments": by_env, "instances": listing["instances"], "claims": listing["claims"]}

    async def _namespace(self, namespace: str) -> dict[str, Any]:
        """Every Campaign and EnvFleet of ``namespace``, as the operator lists them (the last
        listing when it is younger than LIST_TTL_S)."""
        hit = self._listed.get(namespace)
        if hit is not None and time.monotonic() - hit[0] < LIST_TTL_S:
            return hit[1]
        campaigns, fleets = await asyncio.gather(self._listing(namespace, "campaigns"),
                                                 self._listing(namespace, "envfleets"))
        errors = [e for e in (campaigns[1], fleets[1]) if e]
        listing = {"namespace": namespace, "campaigns": campaigns[0], "fleets": fleets[0],
                   "error": "; ".join(dict.fromkeys(errors)) or None}
        self._listed[namespace] = (time.monotonic(), listing)
        return listing

    async def _listing(self, namespace: str, kind: str) -> tuple[list[dict[str, Any]], str | None]:
        try:
            response = await self._client.get(f"{self.operator_url}/v1/namespaces/{namespace}/{kind}",
                                              headers=bearer())
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return [], f"{kind}: {exc}"
        if response.status_code != 200 or not isinstance(body, dict):
            error = body.get("error") if isinstance(body, dict) else None
            return [], f"{kind}: {response.status_code} {error or response.text[:300]}"
        return body.get("campaigns" if kind == "campaigns" else "fleets") or [], None

    async def _prometheus(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, query in PROMQL.items():
            try:
                data = (await self._client.get(f"{self.prometheus_url}/api/v1/query", params={"query": query})).json()
                result = data.get("data", {}).get("result") or []
                out[key] = float(result[0]["value"][1]) if result else None
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                out[key] = None
                out["error"] = str(exc)
        return out

    async def snapshot(self) -> dict[str, Any]:
        rows = list(await asyncio.gather(*(self._instance(i) for i in self.instances)))
        envs: dict[str, dict[str, Any]] = {}
        for row in rows:
            e = envs.setdefault(row["env"], {"env": row["env"], "instances": 0, "states": {}, "held": 0,
                                             "episodes_per_s": 0.0, "tool_calls_per_s": 0.0, "_buckets": {}})
            e["instances"] += 1
            e["states"][row["state"]] = e["states"].get(row["state"], 0) + 1
            e["held"] += bool(row["holder"])
            e["episodes_per_s"] += row.get("episodes_per_s") or 0.0
            e["tool_calls_per_s"] += row.get("tool_calls_per_s") or 0.0
            for b, v in (row.pop("_buckets", None) or {}).items():
                e["_buckets"][b] = e["_buckets"].get(b, 0.0) + v
        for e in envs.values():
            buckets = e.pop("_buckets")
            e["tool_p50_ms"], e["tool_p99_ms"] = _ms(quantile(buckets, 0.5)), _ms(quantile(buckets, 0.99))
            e["episodes_per_s"], e["tool_calls_per_s"] = round(e["episodes_per_s"], 3), round(e["tool_calls_per_s"], 3)
        operator = list(await asyncio.gather(*(self._operator(f) for f in self.fleets))) if self.operator_url else []
        namespaces = list(await asyncio.gather(*(self._namespace(ns) for ns in self.namespaces))) \
            if self.operator_url else []
        return {"at": time.time(), "instances": rows, "environments": sorted(envs.values(), key=lambda e: e["env"]),
                "operator": operator, "namespaces": namespaces,
                "prometheus": await self._prometheus() if self.prometheus_url else None,
                "grafana_url": self.grafana_url}

    def find(self, name: str) -> Instance | None:
        return next((i for i in self.instances if i.name == name), None)

    async def close(self) -> None:
        await self._client.aclose()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
