"""Deadlines on the client's hops to an env server: a hung (SIGSTOP-ed, not dead) server costs
the episode it serves - masked, never charged to the agent - and holds its client no longer than
the deadline (``AWM_ENV_DEADLINE_S``, :func:`awm.client.env_deadline_s`); the next episode runs on
another instance, and the hung one comes back to the pool once it answers again.

No timing threshold here is a performance assertion: each bounds a hang, at the deadline plus a
generous slack for a loaded CI machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from typing import Any, AsyncIterator, Iterator

import pytest

from awm.client import ControlClient, DeadlineExceeded, McpError, McpSession, env_deadline_s
from awm.episode.session import ENV_ERRORS, EnvHandle, EpisodeSession
from awm.episode.sources import PoolSource
from awm.errorclass import ErrorClass
from awm.fleet import Database, LocalFleet

DEADLINE_S = 3.0
SLACK_S = 20.0  # a hang is bounded by the deadline; the slack is for a loaded machine, not a target


@pytest.fixture(scope="module")
def deadline_env() -> Iterator[None]:
    old = os.environ.get("AWM_ENV_DEADLINE_S")
    os.environ["AWM_ENV_DEADLINE_S"] = str(DEADLINE_S)
    yield
    if old is None:
        os.environ.pop("AWM_ENV_DEADLINE_S", None)
    else:
        os.environ["AWM_ENV_DEADLINE_S"] = old


@pytest.fixture(scope="module")
async def fleet(admin_dsn: str, notes_bundle: Any, deadline_env: None) -> AsyncIterator[LocalFleet]:
    # two instances of notes (late binding, as `awm serve`): one to hang, one to carry on
    async with LocalFleet([notes_bundle], replicas=2, database=Database(admin_dsn), allow_ungated=True) as started:
        yield started


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process hung (SIGSTOP) until the block ends, whatever happens in it (SIGCONT)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def pid_of(fleet: LocalFleet, name: str) -> int:
    return next(h.pid for h in fleet.instances if h.name == name)


async def wait_free(source: PoolSource, count: int, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while source.free() < count:
        assert time.monotonic() < deadline, f"only {source.free()} of {count} instances back in the pool"
        await asyncio.sleep(0.1)


async def good_episode(source: PoolSource, avoid: str | None = None) -> str:
    """One whole episode (its reset proven pristine); returns the instance it ran on."""
    lease = await source.claim("notes")
    healthy = False
    try:
        assert lease.name != avoid, "the hung instance was handed out again"
        assert lease.handle is not None
        session = EpisodeSession(lease.handle)
        reset = await session.reset("add_note", verify=True)
        assert reset["pristine"] is True and reset["repaired"] == []
        out = await session.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})
        assert not out.is_error, out.text
        outcome = await session.finish(None)
        assert not outcome.masked and outcome.reward == 1.0, outcome
        healthy = session.healthy
        return lease.name
    finally:
        await source.release(lease, healthy)


# -- the client alone: a peer that accepts and never answers -----------------------------------


class BlackHole:
    """A TCP listener that accepts connections and never answers (``trickle``: sends one byte of
    a response head every 0.2 s, forever: each read is quick, the request never ends)."""

    def __init__(self, trickle: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.trickle = trickle
        self.conns: list[socket.socket] = []
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.trickle:
                threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000
        for byte in head:
            if self.closing:
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(0.2)

    def close(self) -> None:
        self.closing = True
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    yield hole
    hole.close()


def test_the_deadline_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWM_ENV_DEADLINE_S", raising=False)
    assert env_deadline_s() == 60.0
    monkeypatch.setenv("AWM_ENV_DEADLINE_S", "7.5")
    assert env_deadline_s() == 7.5
    assert McpSession("http://127.0.0.1:1/mcp").deadline_s == 7.5
    assert ControlClient("http://127.0.0.1:1").deadline_s == 7.5
    assert ControlClient("http://127.0.0.1:1", timeout=2).deadline_s == 2
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("AWM_ENV_DEADLINE_S", bad)
        with pytest.raises(ValueError, match="AWM_ENV_DEADLINE_S"):
            env_deadline_s()


async def test_every_request_of_both_clients_has_a_deadline(black_hole: BlackHole) -> None:
    control = ControlClient(black_hole.url, timeout=1.0)
    mcp = McpSession(black_hole.url + "/mcp", timeout=1.0)
    try:
        for request in (lambda: control.reset("t"), lambda: control.verify(None), control.diff, control.checksum,
                        control.info, lambda: control.bind("e"), control.sqlite):
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded, match="deadline"):
                await request()
            assert time.monotonic() - t0 < 1.0 + SLACK_S
        assert await control.ready() is False
        t0 = time.monotonic()
        with pytest.raises(McpError, match="deadline"):
            await mcp.initialize()
        with pytest.raises(McpError, match="deadline"):
            await mcp.call_tool("x", {})
        assert time.monotonic() - t0 < 2.0 + SLACK_S
    finally:
        await control.close()
        await mcp.close()


async def test_a_trickling_peer_is_bounded_too() -> None:
    """httpx's own timeouts bound each wait for a byte: a peer that answers one byte at a time
    would hold a request forever. The deadline bounds the whole request."""
    hole = BlackHole(trickle=True)
    control = ControlClient(hole.url, timeout=1.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await control.info()
        assert time.monotonic() - t0 < 1.5 + SLACK_S
    finally:
        await control.close()
        hole.close()


# -- a real env server, hung mid-episode ---------------------------------------------------------


async def test_a_hung_env_server_costs_one_episode_masked(fleet: LocalFleet) -> None:
    source = PoolSource.from_fleet(fleet, claim_timeout_s=120)
    try:
        lease = await source.claim("notes")
        assert lease.handle is not None
        session = EpisodeSession(lease.handle)
        await session.reset("add_note", verify=True)
        out = await session.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})
        assert not out.is_error  # a write the hang leaves uncommitted: the next reset must undo it
        with stopped(pid_of(fleet, lease.name)):
            t0 = time.monotonic()
            hung = await session.call_tool("list_notes", {})
            later = [await session.call_tool("list_notes", {}) for _ in range(3)]
            outcome = await session.finish("done")
            elapsed = time.monotonic() - t0
            assert elapsed < DEADLINE_S + SLACK_S, f"the hung server held the client {elapsed:.1f} s"
            assert hung.is_error and hung.error_kind == ErrorClass.UNAVAILABLE and "deadline" in hung.text
            # not sent: each would have waited out the deadline again
            assert all(r.error_kind == ErrorClass.UNAVAILABLE and "not sent" in r.text for r in later)
            assert outcome.masked and outcome.reward is None and outcome.ended_by == "infrastructure"
            assert "deadline" in (outcome.infra_error or "")
            assert not session.healthy
            await source.release(lease, session.healthy)  # checked before it is handed out again

            # the next episode: on the other instance, whole, while this one is still hung
            other = await good_episode(source, avoid=lease.name)
            assert other != lease.name
        # answering again: back in the pool, its reset pristine (the hung episode's write undone)
        await wait_free(source, 2)
        for _ in range(2):
            await good_episode(source)
    finally:
        await source.close()


async def test_a_hung_free_instance_costs_its_claimer_one_episode(fleet: LocalFleet) -> None:
    """An instance that hangs while free in the pool is handed out (nothing checks a connected
    instance at claim time): its reset fails at the deadline, the episode is aborted as the
    environment's failure, and the instance goes to the check."""
    source = PoolSource.from_fleet(fleet, claim_timeout_s=120)
    try:
        first = await good_episode(source)  # connects it; free again, connected
        lease = await source.claim("notes")
        if lease.name != first:  # the queue hands out the other one first: take the one we want
            await source.release(lease)
            lease = await source.claim("notes")
        assert lease.handle is not None
        session = EpisodeSession(lease.handle)
        with stopped(pid_of(fleet, lease.name)):
            t0 = time.monotonic()
            with pytest.raises(ENV_ERRORS) as raised:
                await session.reset("add_note", verify=True)
            outcome = await session.abort(f"reset failed: {raised.value}")
            assert time.monotonic() - t0 < DEADLINE_S + SLACK_S
            assert isinstance(raised.value, DeadlineExceeded)
            assert outcome.masked and outcome.reward is None
            await source.release(lease, session.healthy)
            await good_episode(source, avoid=lease.name)
        await wait_free(source, 2)
    finally:
        await source.close()


async def test_a_server_hung_before_the_verdict(fleet: LocalFleet) -> None:
    source = PoolSource.from_fleet(fleet, claim_timeout_s=120)
    try:
        lease = await source.claim("notes")
        assert lease.handle is not None
        session = EpisodeSession(lease.handle)
        await session.reset("add_note", verify=True)
        assert not (await session.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})).is_error
        with stopped(pid_of(fleet, lease.name)):
            t0 = time.monotonic()
            outcome = await session.finish(None, diff=True)
            assert time.monotonic() - t0 < DEADLINE_S + SLACK_S
            assert outcome.masked and outcome.reward is None and "verify failed" in (outcome.infra_error or "")
            await source.release(lease, session.healthy)
            await good_episode(source, avoid=lease.name)
        await wait_free(source, 2)
    finally:
        await source.close()


async def test_one_reply_of_many_calls_waits_out_one_deadline(fleet: LocalFleet) -> None:
    """The text form (OpenEnv, verl, SkyRL): a reply of four calls to a hung server sends one."""
    source = PoolSource.from_fleet(fleet, claim_timeout_s=120)
    try:
        lease = await source.claim("notes")
        assert lease.handle is not None
        session = EpisodeSession(lease.handle)
        await session.reset("count_notes")
        reply = "".join('<tool_call>{"name": "list_notes", "arguments": {}}</tool_call>' for _ in range(4))
        with stopped(pid_of(fleet, lease.name)):
            t0 = time.monotonic()
            step = await session.act(reply)
            assert time.monotonic() - t0 < DEADLINE_S + SLACK_S
            assert step.done and step.outcome is not None and step.outcome.masked
            texts = [r["text"] for r in step.results]
            assert len(texts) == 4 and "deadline" in texts[0] and all("not sent" in t for t in texts[1:])
            await source.release(lease, session.healthy)
        await wait_free(source, 2)
    finally:
        await source.close()


async def test_the_call_diff_hop_has_the_deadline_too(fleet: LocalFleet, black_hole: BlackHole) -> None:
    """Per-call diffs (the trainer's default) ask the control API after every successful call: a
    control API that hangs fails the episode at its deadline, once (the next call is not sent)."""
    handle = next(h for h in fleet.instances)
    mcp = McpSession(handle.mcp_url)
    await mcp.initialize()
    env = EnvHandle(mcp, ControlClient(black_hole.url), "notes", handle.name, "", await mcp.list_tools())
    real = ControlClient(handle.control_url)
    try:
        await real.reset("add_note")
        session = EpisodeSession(env, call_diff_rows=10)
        t0 = time.monotonic()
        first = await session.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})
        second = await session.call_tool("list_notes", {})
        assert time.monotonic() - t0 < DEADLINE_S + SLACK_S
        assert not first.is_error and first.diff is None and "deadline" in (first.diff_error or "")
        assert second.error_kind == ErrorClass.UNAVAILABLE and "not sent" in second.text
        outcome = await session.finish(None)
        assert outcome.masked and outcome.reward is None
        assert (await real.reset("add_note"))["episode_id"]  # the instance itself was never hurt
    finally:
        await env.close()
        await real.close()


async def test_the_trainers_episode_ends_masked_within_the_deadline(fleet: LocalFleet) -> None:
    """The trainer's agent loop (trainer.agent.run_episode): the server hangs between two turns."""
    from awm.trainer.agent import AgentConfig, run_episode
    from awm.trainer.policy import PolicyReply

    source = PoolSource.from_fleet(fleet, claim_timeout_s=120)
    lease = await source.claim("notes")
    assert lease.handle is not None
    pid = pid_of(fleet, lease.name)

    class HangsTheServer:
        """Calls add_note, then hangs the server and calls list_notes."""
        version, name = 0, "stub"

        def __init__(self) -> None:
            self.turns = 0

        async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PolicyReply:
            self.turns += 1
            if self.turns == 2:
                os.kill(pid, signal.SIGSTOP)
            call = ("add_note", {"title": "groceries", "body": "milk"}) if self.turns == 1 else ("list_notes", {})
            return PolicyReply(None, [{"id": f"c{self.turns}", "type": "function",
                                       "function": {"name": call[0], "arguments": __import__("json").dumps(call[1])}}])

        async def close(self) -> None:
            return None

    try:
        t0 = time.monotonic()
        try:
            traj = await run_episode(HangsTheServer(), lease.handle, "add_note", AgentConfig(max_turns=5))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert time.monotonic() - t0 < DEADLINE_S + SLACK_S
        assert traj.masked and traj.stop_reason == "infra_error" and "deadline" in (traj.infra_error or "")
        await source.release(lease, traj.infra_error is None)
        await wait_free(source, 2)
        await good_episode(source)
    finally:
        await source.close()


class HangsOnSwitch(BlackHole):
    """An instance that looks fine (``/readyz``, ``/info`` answer) and hangs on anything else: a
    switch of a late-binding instance while the database server under its provisioner hangs."""

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        while not self.closing:
            while b"\r\n\r\n" not in buf:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
            head, buf = buf.split(b"\r\n\r\n", 1)
            line = head.split(b"\r\n", 1)[0]
            if line.startswith((b"GET /readyz", b"GET /info")):
                body = b'{"ready": true, "wedged": false, "db": true, "env": "lamps"}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                continue
            while not self.closing:  # a switch: never answered
                time.sleep(0.1)


async def test_switches_failing_at_their_deadline_cost_time_not_the_claim(
        fleet: LocalFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """Late binding: while a claim's switches fail at their deadline (the database server under the
    provisioner hangs or restarts; the instances themselves look ready), the claim goes on waiting
    - as it waits while every instance is busy - until ``claim_timeout_s``, instead of failing (and
    stopping a training run) after as many failed switches as the pool has instances."""
    from awm.episode.sources import Lease

    monkeypatch.setenv("AWM_ENV_DEADLINE_S", "1")
    hung = [HangsOnSwitch() for _ in range(2)]
    handle = fleet.instances[0]
    good = Lease(handle.env, handle.name, handle.mcp_url, handle.control_url, late=True)
    source = PoolSource([good, *(Lease("lamps", f"hung-{i}", h.url + "/mcp", h.url, late=True)
                                 for i, h in enumerate(hung))], claim_timeout_s=60)
    try:
        held = await source.claim("notes")
        assert held is good
        claim = asyncio.ensure_future(source.claim("notes"))
        await asyncio.sleep(1.0 * 3 * 2 + 2)  # every hung instance failed its switch more than once
        assert not claim.done(), claim  # (before: InstancesUnavailable after max(3, instances) failures)
        await source.release(held)
        assert await asyncio.wait_for(claim, 30) is good
        await source.release(good)
    finally:
        await source.close()
        for server in hung:
            server.close()
