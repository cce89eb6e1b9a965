"""What the operator process holds between its kopf handlers, as one typed object in kopf's memo.

kopf hands every handler the same ``memo``, an untyped dict: keys set by the start-up handler and
read by the others are checked by nothing, and a misspelt key or a wrong type shows only when a
handler runs. So the start-up handler puts one :class:`OperatorState` in the memo, and every
handler reads it through :func:`operator_state` and its typed fields. (The memo also carries what
``main.operate`` passes in, ``config`` and ``kubeconfig``: the start-up handler copies them here.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import kopf
from aiohttp import web

from awm_operator.config import OperatorConfig
from awm_operator.reconcile import Context
from awm_operator.state import Fleets

MEMO_KEY = "awm_state"


@dataclass
class OperatorState:
    """The operator's process state, built by the start-up handler (handlers.startup)."""

    config: OperatorConfig
    kubeconfig: str | None  # the operator's own kubeconfig (tests), else kopf's usual login
    ctx: Context  # what every fleet's reconciler and the allocation API share
    fleets: Fleets
    claim_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # EnvClaim uid -> its binding
    claims_done: set[str] = field(default_factory=set)  # uids bound or failed here: late events must not rebind
    runners: list[web.AppRunner] = field(default_factory=list)  # the allocation API's and the metrics' servers
    watch_tasks: list[asyncio.Task[None]] = field(default_factory=list)  # the pod watch, per namespace

    def keep(self, memo: kopf.Memo) -> None:
        """Store this state in the memo (once, by the start-up handler)."""
        memo[MEMO_KEY] = self


def operator_state(memo: kopf.Memo) -> OperatorState:
    """The state the start-up handler kept in the memo."""
    state = memo[MEMO_KEY]
    if not isinstance(state, OperatorState):
        raise TypeError(f"memo[{MEMO_KEY!r}] is a {type(state).__name__}, not the OperatorState")
    return state


def stored_state(memo: kopf.Memo) -> OperatorState | None:
    """The state, or None if the start-up handler did not get as far as keeping it (cleanup)."""
    return operator_state(memo) if MEMO_KEY in memo else None
