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

from awm_operator.crds import Condition
from awm_operator.phases import ClaimPhase, ClaimReason, ConditionType


def now() -> str:
    """RFC 3339 in UTC, to the second (what the API server stores)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, ok: bool | None, reason: str, message: str, *, generation: int | None = None,
              previous: Iterable[Condition | dict[str, Any]] = (), at: str | None = None) -> Condition:
    """A condition of type ``kind`` (``ok`` None: status Unknown). Its transition time is that of
    the same type in ``previous`` (as written, or as read from the object) when the status did not
    change, else ``at`` (default: now)."""
    status = "Unknown" if ok is None else "True" if ok else "False"
    old = next((c for c in map(_read, previous) if c is not None and c.type == kind), None)
    when = old.last_transition_time if old and old.status == status and old.last_transition_time else at or now()
    return Condition(type=kind, status=status, reason=reason, message=message, last_transition_time=when,
                     observed_generation=generation)


def _read(cond: Condition | dict[str, Any]) -> Condition | None:
    """A condition as read from an object (None if it is not one: someone else's write)."""
    if isinstance(cond, Condition):
        return cond
    try:
        return Condition.model_validate(cond)
    except ValueError:
        return None


# EnvClaim: what each phase says as conditions. Bound: the claim holds instances (also while
# Degraded); Degraded: some of them were lost.
_CLAIM: dict[ClaimPhase, tuple[tuple[bool, ClaimReason], tuple[bool, ClaimReason]]] = {
    ClaimPhase.PENDING: ((False, ClaimReason.WAITING), (False, ClaimReason.NOT_BOUND)),
    ClaimPhase.BOUND: ((True, ClaimReason.BOUND), (False, ClaimReason.ALL_INSTANCES)),
    ClaimPhase.DEGRADED: ((True, ClaimReason.BOUND), (True, ClaimReason.INSTANCES_LOST)),
    ClaimPhase.FAILED: ((False, ClaimReason.FAILED), (False, ClaimReason.NOT_BOUND)),
    ClaimPhase.EXPIRED: ((False, ClaimReason.EXPIRED), (False, ClaimReason.NOT_BOUND)),
}


def claim_conditions(phase: ClaimPhase, message: str, previous: Iterable[Condition | dict[str, Any]] = (),
                     generation: int | None = None) -> list[Condition]:
    """An EnvClaim's conditions ``Bound`` and ``Degraded`` for ``phase``."""
    prev = list(previous)
    (bound, bound_reason), (degraded, degraded_reason) = _CLAIM[phase]
    return [condition(ConditionType.BOUND, bound, bound_reason, message, generation=generation, previous=prev),
            condition(ConditionType.DEGRADED, degraded, degraded_reason, message, generation=generation, previous=prev)]
