"""A fleet reconciler's wake-up timers: one per reason, shared by the jobs of ``reconcile.py``.

Every job of a fleet's reconciler (claims expiring, the status write held back, a scale-down
waiting, the database sweep, the shard probes, a pass to retry) may want the next pass at a
given time rather than at the next event. Each asks for it by reason, and the next ask for the
same reason replaces the timer: a timer per pass piled up thousands an hour on a busy fleet, each
holding its callback. The jobs live in modules of their own (fleet_*.py), so this one object is
handed to each of them.
"""

from __future__ import annotations

import asyncio

from awm_operator.state import Fleet


class WakeUps:
    """The fleet's pending wake-ups, by reason."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.timers: dict[str, asyncio.TimerHandle] = {}

    def at(self, delay: float, why: str) -> None:
        """Poke the fleet in ``delay`` seconds: one timer per reason, replaced by each pass (a
        timer per pass piled up thousands an hour on a busy fleet, each holding its callback)."""
        old = self.timers.pop(why, None)
        if old is not None:
            old.cancel()
        self.timers[why] = asyncio.get_running_loop().call_later(delay, self.fleet.poke)

    def cancel(self) -> None:
        """Drop them all (the fleet's daemon ends)."""
        for timer in self.timers.values():
            timer.cancel()
