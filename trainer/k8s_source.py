"""A campaign's progress, reported to the operator (``POST .../campaigns/{name}/progress``).

Claiming the campaign fleet's instances is the episode layer's
(:class:`awm.episode.sources.HeldClaimsSource`, chosen by :func:`awm.episode.sources.run_source`
inside a Campaign's Job); the old names stay importable from here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

import httpx

from awm.episode.allocation import OperatorSettings, bearer, past_standby
from awm.episode.sources import HeldClaimsSource

log = logging.getLogger("trainer.k8s")

KubernetesSettings = OperatorSettings  # the names a run's code and tests know
KubernetesSource = HeldClaimsSource
__all__ = ["KubernetesSettings", "KubernetesSource", "ProgressReporter"]


class ProgressReporter:
    """Posts a campaign's progress to the operator (``POST .../campaigns/{name}/progress``).

    Never in the way: :meth:`report` returns at once, one request is in flight at a time and
    only the newest report waits behind it (the operator shows the latest numbers anyway), and a
    failure is logged, never raised: losing a progress report must not cost a training run. A
    report that failed (an operator restarting, a standby replica answering 503) is folded into
    the next one, and :meth:`aclose` retries what is left for a while, so the campaign's status
    ends with the run's final numbers. A standby's 503 is asked again at once on a new
    connection, as the allocation client does: kept, the pooled connection would reach the same
    standby with every report.
    """

    close_retries = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds between the last attempts, at close
    standby_retries = 8

    def __init__(self, settings: OperatorSettings, client: httpx.AsyncClient | None = None,
                 timeout: float = 10.0) -> None:
        if not settings.campaign:
            raise ValueError("no campaign to report to (AWM_CAMPAIGN)")
        self.url = (f"{settings.operator_url}/v1/namespaces/{settings.namespace}/campaigns/"
                    f"{settings.campaign}/progress")
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._own = client is None
        self._latest: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0

    @staticmethod
    def payload(step: int | None = None, reward_mean: float | None = None, rollouts_per_s: float | None = None,
                pass_rates: Mapping[str, float] | None = None,
                pass_at_k: Mapping[str, float] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"step": step, "rewardMean": reward_mean, "rolloutsPerS": rollouts_per_s,
                                "passRates": dict(pass_rates) if pass_rates is not None else None,
                                "passAtK": dict(pass_at_k) if pass_at_k is not None else None}
        return {k: v for k, v in body.items() if v is not None}

    def report(self, step: int | None = None, reward_mean: float | None = None, rollouts_per_s: float | None = None,
               pass_rates: Mapping[str, float] | None = None, pass_at_k: Mapping[str, float] | None = None) -> None:
        """Queue a report (call from inside the event loop)."""
        self._latest = {**(self._latest or {}),
                        **self.payload(step, reward_mean, rollouts_per_s, pass_rates, pass_at_k)}
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    def report_step(self, record: Mapping[str, Any]) -> None:
        """A training step's record (``metrics.jsonl`` line)."""
        self.report(step=record.get("step"), reward_mean=record.get("reward_mean"),
                    rollouts_per_s=record.get("rollouts_per_s"))

    async def _drain(self) -> None:
        while self._latest is not None:
            body, self._latest = self._latest, None
            try:
                r = await past_standby(lambda extra: self._client.post(self.url, json=body, headers={**bearer(), **extra}),
                                       self.standby_retries)
                if r.status_code >= 400:
                    raise httpx.HTTPStatusError(f"HTTP {r.status_code}: {r.text[:200]}", request=r.request, response=r)
                self.sent += 1
            except httpx.HTTPError as exc:
                self.failed += 1
                self._latest = {**body, **(self._latest or {})}  # newer numbers win; nothing is lost
                log.warning("progress report to %s failed: %s", self.url, exc)
                return  # the next report, or the close, tries again

    @property
    def pending(self) -> bool:
        """Whether a report has not reached the operator yet."""
        return self._latest is not None

    async def flush(self) -> None:
        """Wait until every queued report was sent (or failed)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def aclose(self) -> None:
        await self.flush()
        for delay in self.close_retries:
            if not self.pending:
                break
            await asyncio.sleep(delay)
            self._task = asyncio.get_running_loop().create_task(self._drain())
            await self.flush()
        if self.pending:
            log.error("the campaign's last progress report could not be delivered to %s", self.url)
        if self._own:
            await self._client.aclose()
