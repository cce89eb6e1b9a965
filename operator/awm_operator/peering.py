"""Waiting for the KopfPeering objects before kopf's peering starts.

Why: kopf announces a replica with one PATCH of the peering object when its peering starts, and
again only every 50-55 s (its ``lifetime`` of 60 s, less jitter). A PATCH that finds no object is
skipped silently. ``helm install`` creates custom resources such as the chart's KopfPeering
after the Deployment, so a replica that starts first announces itself to nothing. When the
object appears a moment later, every replica sees it with no peer in it and resumes. Two
replicas then act at once until the next keep-alive, about a minute later. This was seen on the
real node: two replicas planned the same claims, a release reached the replica that did not
know the claim (404), and a replacement pod was counted by neither.

kopf runs the startup handlers before it starts its peering tasks. So the operator's startup
waits here until every peering object it will use exists, and kopf's first announcement then
lands. kopf keeps every replica paused until it has seen the object, so this wait does not
delay the operator's work.
"""

from __future__ import annotations

import asyncio
import logging
import time

from awm_operator.config import OperatorConfig
from awm_operator.kube import ApiError, Kube

log = logging.getLogger("awm.operator")

GROUP_PATH = "/apis/kopf.dev/v1"


def peering_paths(cfg: OperatorConfig) -> list[str]:
    """The API paths of the peering objects this replica's kopf uses: one KopfPeering per
    served namespace, or the ClusterKopfPeering of a cluster-wide operator; none standalone."""
    if not cfg.peering:
        return []
    if cfg.namespaces:
        return [f"{GROUP_PATH}/namespaces/{ns}/kopfpeerings/{cfg.peering}" for ns in cfg.namespaces]
    return [f"{GROUP_PATH}/clusterkopfpeerings/{cfg.peering}"]


async def wait_for_peering(kube: Kube, cfg: OperatorConfig, interval: float = 0.5,
                           report_every: float = 30.0) -> None:
    """Return once every peering object of ``cfg`` exists. Waits as long as it takes (kopf
    would not act without them either) and logs what it waits for every ``report_every``
    seconds. Errors other than 404 are logged and retried the same way."""
    missing = peering_paths(cfg)
    started = reported = time.monotonic()
    while missing:
        still = []
        for path in missing:
            try:
                await kube.request("GET", path)
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("peering object %s: %s", path, exc)
                still.append(path)
        missing = still
        if not missing:
            break
        if time.monotonic() - reported >= report_every:
            reported = time.monotonic()
            log.warning("waited %.0f s for the peering objects %s (the chart creates them: kopf acts only "
                        "once they exist)", reported - started, ", ".join(missing))
        await asyncio.sleep(interval)
