"""Where episodes get instances: one contract, three places instances come from, and the one
function that decides between them.

    source.claim(E)          -> Lease                one instance of environment E
    source.claim_group(E, G) -> [Lease] * <= G       G instances of E, claimed whole (a GRPO group)
    source.release(leases, healthy=...)              back to the source (unhealthy: checked first)

Every lease comes connected (:class:`~awm.episode.session.EnvHandle`: an MCP session and a
control client), so an :class:`~awm.episode.session.EpisodeSession` can start on it at once.

* :class:`PoolSource` - instances already running: a :class:`~awm.fleet.LocalFleet`'s, or the
  lines ``awm serve --json`` prints. An instance that cannot be reached goes to a background
  check and the next one is tried (a dead instance is our failure, never an episode's); a group
  is claimed whole under a lock, never piecemeal (two groups holding half the pool each would
  wait for each other forever); a group may be smaller than asked when the pool is.
* :class:`LocalFleetSource` - a pool of instances this process starts (:class:`~awm.fleet.LocalFleet`).
* :class:`HeldClaimsSource` - a pool of an EnvFleet's instances claimed from the operator's
  allocation API once, at start (per environment, as GRPO groups), renewed while the run lasts,
  a lost instance replaced by a fresh claim; every episode resets its instance itself, so nothing
  goes back to the operator between episodes. What a training or evaluation run uses.
* :class:`OperatorSource` - one operator claim per :meth:`~InstanceSource.claim` (one group
  claim per :meth:`~InstanceSource.claim_group`); releasing it makes the operator reset the
  instances and return them to the fleet. What a framework adapter uses, whose episodes come and
  go at the framework's pace.

:func:`run_source` decides for a run (inside a Campaign's Job: the campaign's fleet; elsewhere a
local fleet); :func:`source_from_config` decides for an adapter's configuration. The interface
claims *by environment*: a source that binds environments late (an operator that starts an
environment's instances on its first claim) fits behind the same two calls.

The contract is in :mod:`.lease`, the running pools in :mod:`.pool`, the operator's claims in
:mod:`.claimed`; this module chooses between them (and keeps, per process, the source each
adapter configuration made, so that every environment object of a run shares one).
"""

from __future__ import annotations

import json
from typing import Any

from awm.episode.allocation import OperatorSettings
from awm.episode.sources.claimed import HeldClaimsSource, OperatorClaims, OperatorSource
from awm.episode.sources.lease import EnvironmentRefused, InstanceSource, InstancesUnavailable, Lease
from awm.episode.sources.pool import LocalFleetSource, PoolSource

__all__ = ["EnvironmentRefused", "HeldClaimsSource", "InstanceSource", "InstancesUnavailable", "Lease",
           "LocalFleetSource", "OperatorClaims", "OperatorSource", "PoolSource", "run_source", "source_from_config"]


def run_source(bundles: list[Any], replicas: int, group_size: int | None = None, *,
               database_url: str | None = None, settings: OperatorSettings | None = None,
               instances: int | None = None, **serving: Any) -> InstanceSource:
    """The instance source of a training or evaluation run (start it with ``async with``): inside
    a Campaign's Job (``AWM_OPERATOR_URL`` and ``AWM_FLEET`` set, or ``settings`` given) the
    campaign's fleet, ``replicas`` instances of every environment held for the run; elsewhere a
    local fleet of ``replicas`` per environment on ``database_url`` - or, with ``instances``, that
    many in all, each switched to the environment a claim asks for (late binding: a catalog of a
    thousand environments needs no thousand instances; in a Campaign's Job with ``instances``,
    the campaign's late-binding fleet, one operator claim per group) - (``serving``: its judge,
    verifier kind and ``allow_ungated``). The one place a run decides where instances come from."""
    settings = settings or OperatorSettings.from_env()
    if settings is not None and instances is not None:  # a late-binding fleet: a claim per group
        return OperatorSource(settings, [b.name for b in bundles],
                              scenarios={b.name: b.scenario.description for b in bundles})
    if settings is not None:
        return HeldClaimsSource(settings, [b.name for b in bundles], replicas, group_size,
                                {b.name: b.scenario.description for b in bundles})
    return LocalFleetSource(bundles, replicas, database_url=database_url, instances=instances, **serving)


_configured: dict[str, InstanceSource] = {}


def source_from_config(config: Any) -> InstanceSource:
    """The process's instances for a framework adapter's configuration (made once per config, so
    every environment object of a run shares one pool or one operator client):

    * ``{"instances_file": PATH}`` - the lines ``awm serve --json`` printed;
    * ``{"operator": {"url", "namespace", "fleet", "environments"}}`` - claims from an EnvFleet
      (``{"operator": {"environments": [...]}}`` alone: the rest from a Campaign Job's
      environment, ``AWM_OPERATOR_URL``/``AWM_NAMESPACE``/``AWM_FLEET``).

    Call it on the loop the instances are used from (:func:`awm.integrations.loop.shared_loop`).
    """
    data = dict(config.items()) if hasattr(config, "items") else dict(config)
    key = json.dumps({k: data.get(k) for k in ("instances_file", "operator")}, sort_keys=True, default=str)
    if key in _configured:
        return _configured[key]
    made: InstanceSource
    if data.get("instances_file"):
        made = PoolSource.from_json_lines(data["instances_file"])
    elif data.get("operator") is not None:
        op = dict(data["operator"].items()) if hasattr(data["operator"], "items") else dict(data["operator"])
        settings = OperatorSettings.from_env()
        if op.get("url"):
            settings = OperatorSettings(op["url"].rstrip("/"), op.get("namespace") or "default", op["fleet"],
                                        op.get("campaign"))
        if settings is None:
            raise ValueError("operator: give url and fleet, or run in a Campaign Job (AWM_OPERATOR_URL, AWM_FLEET)")
        made = OperatorSource(settings, list(op.get("environments") or []))
    else:
        raise ValueError("say where the instances are: instances_file (awm serve --json) or operator")
    _configured[key] = made
    return made
