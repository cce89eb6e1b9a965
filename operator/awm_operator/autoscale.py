"""Autoscaling a fleet from demand (the Agones "buffer" policy, plus claims that wait).

``replicas = allocated + pending claim demand + buffer``, clamped to ``[minReplicas,
maxReplicas]``. Scaling up is immediate (a waiting claim is a trainer step stalling); scaling
down waits until the lower target has held for ``scale_down_delay`` seconds, so a fleet does not
shed instances between two training steps and recreate them a second later.
"""

from __future__ import annotations

from dataclasses import dataclass


def desired_replicas(allocated: int, pending: int, buffer: int, minimum: int, maximum: int) -> int:
    target = allocated + pending + buffer
    return max(minimum, min(maximum, target)) if maximum >= minimum else minimum


@dataclass
class ScaleDownGate:
    delay: float
    _lower_since: float | None = None

    def decide(self, current: int, target: int, now: float) -> int | None:
        """The replicas to set now, or None to leave ``current`` as it is."""
        if target > current:
            self._lower_since = None
            return target
        if target == current:
            self._lower_since = None
            return None
        if self._lower_since is None:
            self._lower_since = now
        if now - self._lower_since >= self.delay:
            self._lower_since = None
            return target
        return None

    def due_in(self, now: float) -> float | None:
        """Seconds until a pending scale-down may happen (to wake the reconciler then)."""
        return None if self._lower_since is None else max(0.0, self._lower_since + self.delay - now)
