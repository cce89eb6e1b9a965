"""The reconciler (awm_operator/reconcile.py) and its jobs (fleet_*.py): reading a selector's index
beside the pass, its wake-up timer, connecting to free pods ahead of their claims, retrying a
failed pass, the database sweep, status writes; and the autoscaling math it applies (autoscale.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from awm_operator.autoscale import ScaleDownGate, desired_replicas
from awm_operator.config import OperatorConfig
from awm_operator.databases import Shard
from awm_operator.metrics import Metrics
from awm_operator.pods import A_CONTROL_URL, PodInfo
from awm_operator.state import ClaimRecord, Fleet
from tests.operator_fakes import fleet_spec, ledger_fleet, pod


async def test_selector_reads_run_beside_the_reconcile_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The index is read in a background task: the pass goes on without it; a selector changed
    mid-read cancels the old read (its answer never lands); an error shows until the selector
    is dropped for a list."""
    from types import SimpleNamespace

    from awm_operator import fleet_selection
    from awm_operator.reconcile import Context, Reconciler

    gates: dict[str, asyncio.Event] = {}
    answers = {"c": ["crm", "crm_lite", "hotel"], "broken": ValueError("ConfigMap broken is missing")}

    async def fake_read(kube, http, namespace, catalog):  # noqa: ANN001, ANN202
        name = catalog.index_config_map
        gates[name] = gate = asyncio.Event()
        await gate.wait()
        if isinstance(answers[name], Exception):
            raise answers[name]
        return answers[name]

    monkeypatch.setattr(fleet_selection, "read_index", fake_read)
    ctx = Context(kube=None, allocator=SimpleNamespace(http=None), metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    fleet = Fleet("ns", "f")
    sel = Reconciler(fleet, ctx).selection

    def use(**spec: object) -> None:
        fleet.spec = fleet_spec(**spec)

    use(environments=[], environmentSelector={"matchNames": ["crm*"]}, catalog={"indexConfigMap": "c"})
    assert await sel.environments(0.0) is None and sel.task is not None  # not waited for
    await asyncio.sleep(0)
    old = sel.task
    use(environments=[], environmentSelector={"matchNames": ["hotel"]}, catalog={"indexConfigMap": "c"})
    assert await sel.environments(1.0) is None
    await asyncio.sleep(0)
    assert old.cancelled() and sel.task is not old
    gates["c"].set()
    await sel.task
    assert await sel.environments(2.0) == ["hotel"] and sel.task is None  # fresh: no new read
    use(environments=[], environmentSelector={"matchNames": ["hotel"]}, catalog={"indexConfigMap": "broken"})
    assert await sel.environments(3.0) is None  # another catalog: the old choice is not its answer
    await asyncio.sleep(0)
    gates["broken"].set()
    await sel.task
    assert sel.error == "catalog index: ConfigMap broken is missing" and fleet.selected is None
    use()
    assert await sel.environments(4.0) == ["crm", "bike_shop"]
    assert sel.error is None and fleet.selected is None and sel.last_read == ("", 0.0)


async def test_a_pass_replaces_its_wake_up_timer() -> None:
    """Every pass over a fleet holding claims with a TTL asks to be woken at the next expiry: one
    timer, replaced by the next pass, not one more per pass (a busy 4,096-instance fleet makes
    several passes a second, for hours)."""
    from awm_operator.reconcile import Context, Reconciler

    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    fleet = ledger_fleet(2)
    fleet.assign("api_1", ClaimRecord([["p0"]], expires=time.time() + 3600))
    rec = Reconciler(fleet, ctx)
    handles = []
    for i in range(5):
        rec.claims.release_orphans(float(i))
        handles.append(rec.wakeups.timers["expiry"])
    assert len(rec.wakeups.timers) == 1 and all(h.cancelled() for h in handles[:-1]) and not handles[-1].cancelled()
    handles[-1].cancel()


async def test_the_operator_connects_to_free_pods_ahead_of_their_claims() -> None:
    """Each free ready pod gets a kept connection before its first claim, in the background (a
    step's first binds would otherwise connect to every pod); pods a claim holds, pods not ready
    and pods that refuse are left, a second round opens nothing more, and a round a pod refused
    holds the next one off for a while (such pods would cost a round every pass)."""
    import socket
    from types import SimpleNamespace

    from awm_operator import fleet_connections
    from awm_operator.podhttp import PodHttp
    from awm_operator.reconcile import Context, Reconciler

    with socket.socket() as s:  # a port nobody listens on: the pod that refuses
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    connections: list[int] = []
    requests: list[bytes] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:  # keep-alive: answer every request on the connection
                head = await reader.readuntil(b"\r\n\r\n")
                requests.append(head.split(b"\r\n", 1)[0])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    fleet = Fleet("ns", "f", uid="u1")
    for i in range(4):  # one address for all (a benchmark's stub): one connection per free pod
        fleet.update_pod(PodInfo.from_pod(pod(f"p{i}", **{A_CONTROL_URL: url})))
    fleet.update_pod(PodInfo.from_pod(pod("starting", ready=False, **{A_CONTROL_URL: url})))
    fleet.update_pod(PodInfo.from_pod(pod("gone", **{A_CONTROL_URL: f"http://127.0.0.1:{refused}"})))
    fleet.assign("c1", ClaimRecord([["p3"]]))
    http = PodHttp()
    ahead = Reconciler(fleet, Context(kube=None, allocator=SimpleNamespace(pods=http), metrics=None,  # type: ignore[arg-type]
                                      config=OperatorConfig())).connections
    try:
        ahead.start()
        await asyncio.wait_for(ahead.task, 10)  # type: ignore[arg-type]
        assert len(connections) == 3 and http.idle_count(url) == 3
        assert set(requests) == {b"GET /healthz HTTP/1.1"}
        first = ahead.task
        ahead.start()  # the refusing pod backs the rounds off: none for a while
        assert ahead.task is first
        ahead.quiet_until -= fleet_connections.CONNECT_AHEAD_BACKOFF_S
        ahead.start()  # all the others kept: the refusing pod is tried again, only it
        await asyncio.wait_for(ahead.task, 10)  # type: ignore[arg-type]
        assert ahead.task is not first and len(connections) == 3
        fleet.remove_pod("gone")
        fleet.unassign("c1")  # p3 is free now
        ahead.quiet_until -= fleet_connections.CONNECT_AHEAD_BACKOFF_S  # (the refusing pod's last back-off)
        ahead.start()
        await asyncio.wait_for(ahead.task, 10)  # type: ignore[arg-type]
        assert len(connections) == 4 and http.idle_count(url) == 4
    finally:
        await http.close()
        server.close()


class _Stopped:
    """kopf's DaemonStopped, as much of it as Reconciler.run uses."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self) -> None:
        await self.event.wait()


async def test_a_failed_pass_is_retried_not_the_end_of_the_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that raises (an API request timing out, a dropped connection) is logged and the
    next pass follows after a back-off; the fleet's daemon keeps running (ending it would leave
    the fleet unattended until kopf restarts the daemon, 60 s later)."""
    from awm_operator import reconcile
    from awm_operator.reconcile import Context, Reconciler

    monkeypatch.setattr(reconcile, "RETRY_BASE_S", 0.05)
    ctx = Context(kube=None, allocator=None, metrics=Metrics(), config=OperatorConfig(reconcile_min_interval=0.0))  # type: ignore[arg-type]
    fleet = Fleet("ns", "f")
    fleet.spec = fleet_spec()
    rec = Reconciler(fleet, ctx)
    passes: list[str] = []
    done = asyncio.Event()

    async def take_over(stopped: object) -> bool:
        return True

    async def flaky_pass() -> bool:
        passes.append("x")
        if len(passes) <= 2:
            raise asyncio.TimeoutError("the API server did not answer")
        done.set()
        return False

    monkeypatch.setattr(rec, "take_over", take_over)
    monkeypatch.setattr(rec, "reconcile", flaky_pass)
    stopped = _Stopped()
    daemon = asyncio.create_task(rec.run(stopped))
    await asyncio.wait_for(done.wait(), 60)  # a watchdog: without the retry this never happens
    assert len(passes) == 3 and not daemon.done()
    stopped.event.set()
    fleet.poke()
    await asyncio.wait_for(daemon, 60)


async def test_the_database_sweep_never_holds_up_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping the databases of deleted pods runs beside the pass, one sweep at a time: a
    database server that hangs leaves the fleet's pods and status going."""
    import threading

    from awm_operator import fleet_sweep
    from awm_operator.reconcile import Context, Reconciler

    release = threading.Event()
    sweeps: list[set[str]] = []

    def hanging_drop(dsn: str, namespace: str, fleet_name: str, live: set[str]) -> list[str]:
        sweeps.append(live)
        release.wait(60)
        return ["awm_i_gone"]

    async def shards(kube: object, fleet: object) -> dict[str, Shard]:
        return {"default": Shard("default", "dsn", "host=db")}

    monkeypatch.setattr(fleet_sweep.databases, "drop_orphans", hanging_drop)
    monkeypatch.setattr(fleet_sweep, "read_shards", shards)
    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig(db_sweep_interval=1.0))  # type: ignore[arg-type]
    ctx.started -= 60
    fleet = ledger_fleet(2)
    rec = Reconciler(fleet, ctx)
    rec.sweep.last -= 10
    rec.sweep.start_if_due(time.monotonic())  # returns while the sweep hangs
    task = rec.sweep.task
    assert task is not None and not task.done()
    rec.sweep.last -= 10
    rec.sweep.start_if_due(time.monotonic())  # due again, but one is in flight
    assert rec.sweep.task is task
    release.set()
    await asyncio.wait_for(task, 60)
    assert rec.sweep.task is None and sweeps == [{"p0", "p1"}]
    rec.wakeups.cancel()


async def test_a_status_another_replica_wrote_over_is_written_again() -> None:
    """A replica skips a status write when nothing changed since its own last one; if another
    replica wrote the status in between (two acting at once, a standby's last pass), the
    object's status must still end up as this replica counts, not as the other one left it."""
    from awm_operator.reconcile import Context, Reconciler

    writes: list[dict] = []

    class Kube:
        async def patch_status(self, plural: str, namespace: str, name: str, status: Any) -> dict:
            writes.append(status.patch())
            return {}

    ctx = Context(kube=Kube(), allocator=None, metrics=Metrics(),  # type: ignore[arg-type]
                  config=OperatorConfig(status_min_interval=0.0))
    fleet = ledger_fleet(2)
    fleet.spec = fleet_spec(replicas=2)
    status = Reconciler(fleet, ctx).status
    await status.write(force=False)
    assert writes[-1]["ready"] == 2
    fleet.set_body({"metadata": {"name": "f"}, "status": writes[-1]})  # the watch shows our write
    await status.write(force=False)
    assert len(writes) == 1  # nothing changed: no write
    other = {**writes[-1], "ready": 1, "allocated": 1}  # another replica's count
    fleet.set_body({"metadata": {"name": "f"}, "status": other})
    await status.write(force=False)
    assert len(writes) == 2 and writes[-1]["ready"] == 2 and writes[-1]["allocated"] == 0


# --------------------------------------------------------------------------- autoscaling


def test_desired_replicas() -> None:
    assert desired_replicas(allocated=10, pending=6, buffer=4, minimum=0, maximum=100) == 20
    assert desired_replicas(0, 0, 0, minimum=2, maximum=100) == 2
    assert desired_replicas(90, 40, 8, minimum=0, maximum=100) == 100


def test_scale_down_waits_scale_up_does_not() -> None:
    gate = ScaleDownGate(delay=30)
    assert gate.decide(current=10, target=20, now=0) == 20
    assert gate.decide(current=20, target=12, now=1) is None
    assert gate.due_in(now=11) == pytest.approx(20)
    assert gate.decide(current=20, target=14, now=20) is None
    assert gate.decide(current=20, target=14, now=31) == 14
    assert gate.decide(current=14, target=18, now=32) == 18
    assert gate.decide(current=18, target=10, now=33) is None
    assert gate.decide(current=18, target=18, now=34) is None  # demand came back: the timer resets
    assert gate.decide(current=18, target=10, now=35) is None
