"""The contract every instance source keeps: a :class:`Lease` (one claimed, connected instance)
and :class:`InstanceSource` (claim one or a group of an environment, give them back), and the two
ways a claim fails."""

from __future__ import annotations

import abc
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Mapping

from awm.client import ControlClient
from awm.episode.session import EnvHandle


@dataclass
class Lease:
    """One claimed instance: its environment, name and URLs, the operator claim it is in (if
    any) and its connected clients (kept by a pool between claims)."""

    env: str
    name: str
    mcp_url: str
    control_url: str
    scenario: str = ""
    claim_id: str | None = None
    handle: EnvHandle | None = field(default=None, repr=False)
    late: bool = False  # the instance binds environments late: a claim of another one switches it
    cached: frozenset[str] = frozenset()  # environments it keeps ready (its last /bind said so)
    unswitched: bool = False  # claimed for ``env`` but not switched to it yet: connect() switches it
    switched: dict[str, Any] | None = field(default=None, repr=False)  # its last /bind's answer (bind_ms, phases_ms)

    async def connect(self) -> EnvHandle:
        """The connected clients, made once; an instance the operator left to us to switch
        (``unswitched``) is switched to ``env`` first, through the control client the handle then
        keeps. A switch that fails raises, and the next connect tries again."""
        if self.handle is None:
            control = ControlClient(self.control_url)
            try:
                await self.ensure_switched(control)
            except BaseException:
                await control.close()
                raise
            self.handle = await EnvHandle.connect(self.mcp_url, self.control_url, self.env, self.name,
                                                  self.scenario, control=control)
        return self.handle

    async def ensure_switched(self, control: ControlClient | None = None) -> None:
        """Switch the instance to ``env`` if the operator left that to us (``unswitched``)."""
        if self.unswitched:
            await self._switch(self.env, control)
            self.unswitched = False

    async def disconnect(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            with contextlib.suppress(Exception):
                await handle.close()

    async def bind(self, env: str, scenario: str = "") -> dict[str, Any]:
        """Switch the instance to ``env`` (late binding) and open a new MCP session on it (the
        switch ended the old one) over the connections the lease holds. Returns the env server's
        account of the switch."""
        result = await self._switch(env, self.handle.control if self.handle else None)
        self.env, self.scenario, self.unswitched = env, scenario, False
        if self.handle is None:
            await self.connect()
            return result
        if result.get("switched") is False:  # it served env already: its session did not end
            self.handle.env, self.handle.scenario = env, scenario
            return result
        try:
            await self.handle.renew(env, scenario)
        except BaseException:
            await self.disconnect()
            raise
        return result

    async def _switch(self, env: str, control: ControlClient | None = None) -> dict[str, Any]:
        """``POST /bind`` through ``control`` (a short-lived client when None)."""
        client = control or ControlClient(self.control_url)
        try:
            result = await client.bind(env)
        finally:
            if control is None:
                await client.close()
        self.cached = frozenset(result.get("cached_envs") or (env,))
        self.switched = result
        return result


class EnvironmentRefused(KeyError):
    """A late-binding instance refused to switch to an environment (not in its catalog, broken,
    or the instance is pinned): asking again will not help."""


class InstancesUnavailable(RuntimeError):
    """No instance of an environment could be used for a long while: the fleet, not an episode,
    is broken, and the run stops with what it finished."""


def lease_list(leases: Lease | list[Lease]) -> list[Lease]:
    return [leases] if isinstance(leases, Lease) else list(leases)


class InstanceSource(abc.ABC):
    """Where episodes get instances: claim one (or a group) of an environment, give them back."""

    @abc.abstractmethod
    def envs(self) -> list[str]: ...

    @abc.abstractmethod
    async def claim(self, env: str | None = None) -> Lease:
        """A connected instance of ``env`` that nobody else uses until :meth:`release` (waits if
        none is free); ``None``: the environments in turn."""

    @abc.abstractmethod
    async def claim_group(self, env: str, size: int) -> list[Lease]:
        """``size`` connected instances of ``env`` at once (fewer when the source has fewer:
        the caller then runs its samples on them in turns)."""

    @abc.abstractmethod
    async def release(self, leases: Lease | list[Lease], healthy: bool = True) -> None:
        """Give instances back; ``healthy=False``: one failed us and must be checked first."""

    async def prepare(self, wants: Mapping[str, int]) -> None:
        """A hint: ``wants`` (environment -> instances) will be claimed soon (a GRPO step's next
        groups), so a source that binds environments late may make them ready now, off the
        claim path. Never fails a run; the default does nothing."""
        return None

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> InstanceSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RoundRobin:
    """The environments in turn, for a claim that names none."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, envs: list[str]) -> str:
        if not envs:
            raise ValueError("no environments to claim from")
        return envs[next(self._turn) % len(envs)]
