"""Status conditions of the operator's kinds, built one way (metav1.Condition's fields).

A condition says one thing about an object (``Ready``, ``DatabaseAvailable``, ``Bound``) with a
machine-readable ``reason`` and a human ``message``; ``lastTransitionTime`` is when its
``status`` last changed, so it is kept from the condition it replaces while the status stays the
same (a new message or reason is not a transition). ``observedGeneration`` is the
``metadata.generation`` the writer acted on. Every status writer (reconcile.py for EnvFleets,
handlers.py and reconcile.py for EnvClaims, campaigns.py) builds its conditions here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any


def now() -> str:
    """RFC 3339 in UTC, to the second (what the API server stores)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, ok: bool | None, reason: str, message: str, *, generation: int | None = None,
              previous: Iterable[dict[str, Any]] = (), at: str | None = None) -> dict[str, Any]:
    """A condition of type ``kind`` (``ok`` None: status Unknown). Its transition time is that of
    the same type in ``previous`` when the status did not change, else ``at`` (default: now)."""
    status = "Unknown" if ok is None else "True" if ok else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    when = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") \
        else at or now()
    cond: dict[str, Any] = {"type": kind, "status": status, "reason": reason, "message": message,
                            "lastTransitionTime": when}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


# EnvClaim: what each phase says as conditions. Bound: the claim holds instances (also while
# Degraded); Degraded: some of them were lost.
_CLAIM = {
    "Pending": ((False, "Waiting"), (False, "NotBound")),
    "Bound": ((True, "Bound"), (False, "AllInstances")),
    "Degraded": ((True, "Bound"), (True, "InstancesLost")),
    "Failed": ((False, "Failed"), (False, "NotBound")),
    "Expired": ((False, "Expired"), (False, "NotBound")),
}


def claim_conditions(phase: str, message: str, previous: Iterable[dict[str, Any]] = (),
                     generation: int | None = None) -> list[dict[str, Any]]:
    """An EnvClaim's conditions ``Bound`` and ``Degraded`` for ``phase``."""
    prev = list(previous)
    (bound, bound_reason), (degraded, degraded_reason) = _CLAIM[phase]
    return [condition("Bound", bound, bound_reason, message, generation=generation, previous=prev),
            condition("Degraded", degraded, degraded_reason, message, generation=generation, previous=prev)]
