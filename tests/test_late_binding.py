"""Late binding on real parts: env servers that switch environments when claimed, with databases
from the fleet's provisioner (real PostgreSQL), MCP over HTTP, the control API, and the claim
path of awm.episode.sources."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from awm import catalog
from awm.client import ControlApiError, ControlClient, McpError, McpSession
from awm.episode.sources import Lease, LocalFleetSource, PoolSource
from awm.fleet import Database, LocalFleet
from awm.postgres import provision, snapshot
from awm.postgres.spares import SPARE, Spares, made_at
from awm.postgres.provisioner import Provisioner, ProvisionerClient, ProvisionerError, ProvisionerServer
from tests.k8s_e2e import wait_for


@pytest.fixture(scope="module")
def bundles(notes_bundle):
    return [notes_bundle, *catalog.load("starter", ["crm", "project_tracker"])]


@pytest.fixture(scope="module")
async def fleet(admin_dsn, bundles):
    # Two instances for three environments, each keeping at most two environments ready.
    fleet = LocalFleet(bundles, database=Database(admin_dsn), allow_ungated=True, instances=2, cache_envs=2)
    await fleet.start()
    yield fleet
    await fleet.stop()


def _metric(text: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def _wait_dropped(admin_dsn: str, database: str, seconds: float = 10.0) -> None:
    """Until ``database`` is gone (drops run after the answer that causes them), then say so."""
    deadline = time.monotonic() + seconds
    while database in provision.list_instances(admin_dsn) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert database not in provision.list_instances(admin_dsn)


async def test_an_instance_switches_environment_and_keeps_every_guarantee(fleet, bundles):
    handle = fleet.instances[0]
    control = ControlClient(handle.control_url)
    mcp = McpSession(handle.mcp_url)
    try:
        info = await control.info()
        assert info["env"] == "notes" and info["late_binding"] is True
        await mcp.initialize()
        assert {t["name"] for t in await mcp.list_tools()} == {t.name for t in bundles[0].tools}
        await control.reset("add_note")
        await mcp.call_tool("add_note", {"title": "written before the switch"})
        notes_db = (await control.info())["database"]
        assert notes_db == handle.db.dbname

        switched = await control.bind("crm")
        assert switched["switched"] is True and switched["cached"] is False and switched["pristine"] is True
        assert switched["database_source"] in ("clone", "ready")  # a local fleet has no spares
        assert switched["previous"] == "notes"
        assert (await control.info())["database"] not in (None, notes_db)
        # The old MCP session ended with the switch: the client must initialize again ...
        with pytest.raises(McpError, match="404|Session not found"):
            await mcp.list_tools()
        await mcp.close()
        mcp = McpSession(handle.mcp_url)
        await mcp.initialize()
        crm = bundles[1]
        # ... and then sees the new environment's tools, /info its tasks.
        assert {t["name"] for t in await mcp.list_tools()} == {t.name for t in crm.tools}
        info = await control.info()
        assert info["env"] == "crm" and {t["id"] for t in info["tasks"]} == {t.id for t in crm.tasks}
        assert info["cached_envs"] == ["notes", "crm"]
        task = crm.tasks[0]
        started = await control.reset(task.id)
        assert started["env"] == "crm" and started["instruction"] == task.instruction
        verdict = await control.verify(None)
        assert verdict["verdict"] in ("complete", "incomplete") and verdict["task_id"] == task.id

        # A repeat claim of a cached environment is a reset: its database, at the snapshot.
        back = await control.reset("add_note", verify=True, env="notes")
        assert back["bind"]["cached"] is True and back["env"] == "notes" and back["pristine"] is True
        assert (await control.info())["database"] == notes_db
        assert (await control.diff())["tables"] == {}
        await mcp.close()
        mcp = McpSession(handle.mcp_url)
        await mcp.initialize()
        rows = (await mcp.call_tool("list_notes", {})).structured
        assert "written before the switch" not in json.dumps(rows)

        async with httpx.AsyncClient() as client:
            text = (await client.get(handle.control_url + "/metrics")).text
        assert _metric(text, "awm_instance_info", env="notes") == 1
        assert _metric(text, "awm_instance_info", env="crm") == 0
        assert _metric(text, "awm_binds_total", kind="new") == 1
        assert _metric(text, "awm_binds_total", kind="cached") == 1
        # two databases acquired: the first environment's at the start, crm's at the switch
        assert sum(_metric(text, "awm_databases_acquired_total", source=s) for s in ("clone", "ready", "spare")) == 2
        assert _metric(text, "awm_tool_calls_total", env="notes", tool="add_note", outcome="ok") == 1
    finally:
        await mcp.close()
        await control.close()


async def test_the_cache_is_bounded_and_an_evicted_database_is_dropped(fleet, admin_dsn):
    handle = fleet.instances[1]
    control = ControlClient(handle.control_url)
    try:
        first = (await control.info())["env"]
        order = [e for e in ("notes", "crm", "project_tracker") if e != first]
        first_db = (await control.info())["database"]
        for env in order:
            await control.bind(env)
        info = await control.info()
        assert info["cached_envs"] == order and info["switches"] == 2  # cache_envs=2: the first is gone
        # dropped off the claim path, in the background: wait for it (generously; not a timing check)
        deadline = time.monotonic() + 60
        while first_db in provision.list_instances(admin_dsn) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert first_db not in provision.list_instances(admin_dsn)
        again = await control.bind(first)
        assert again["cached"] is False and again["pristine"] is True
    finally:
        await control.close()


async def test_hostile_bind_requests_get_clear_errors(fleet):
    handle = fleet.instances[0]
    async with httpx.AsyncClient(base_url=handle.control_url) as client:
        before = (await client.get("/info")).json()["env"]
        for body, status in (({"env": "../../../etc/passwd"}, 404), ({"env": "no_such_env"}, 404),
                             ({"env": 7}, 400), ({}, 400), ({"env": ""}, 400), ({"env": "x" * 300}, 400),
                             ({"env": "\ud800"}, 400)):
            r = await client.post("/bind", content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code == status, (body, r.text)
            assert "error" in r.json()
        r = await client.post("/bind", content=b"[" * 100_000)
        assert r.status_code == 400
        r = await client.post("/bind", content=b"{" + b" " * (2 << 20) + b"}")
        assert r.status_code == 413
        r = await client.post("/reset", json={"task_id": None, "env": "no_such_env"})
        assert r.status_code == 404
        assert (await client.get("/info")).json()["env"] == before  # nothing changed
        assert (await client.get("/readyz")).status_code == 200


async def test_an_environment_made_ready_ahead_costs_a_reset_when_claimed(admin_dsn, bundles):
    """POST /prepare during another environment's episode: that episode goes on untouched (its
    writes, its tools, the environment served), and a claim of the prepared one is then a
    reset of a database checked against its snapshot, not a switch to a new database."""
    async with LocalFleet(bundles, database=Database(admin_dsn), allow_ungated=True, instances=1,
                          cache_envs=2) as fleet:
        handle = fleet.instances[0]
        control = ControlClient(handle.control_url)
        mcp = McpSession(handle.mcp_url)
        try:
            first = (await control.info())["env"]
            assert first == "notes"
            await control.reset("add_note")
            await mcp.initialize()
            await mcp.call_tool("add_note", {"title": "during the preparation"})
            made = await control.prepare("crm")
            assert made["prepared"] is True and made["serving"] == "notes", made
            assert made["cached_envs"] == ["notes", "crm"] and made["phases_ms"]["acquire_database"] >= 0
            # the episode of notes is as it was: same environment, same session, its write still there
            info = await control.info()
            assert info["env"] == "notes" and info["cached_envs"] == ["notes", "crm"]
            assert "during the preparation" in json.dumps((await mcp.call_tool("list_notes", {})).structured)
            assert (await control.diff())["tables"] != {}
            again = await control.prepare("crm")  # made already: nothing to do
            assert again["prepared"] is False and again["cached"] is True
            bound = await control.bind("crm")
            assert bound["cached"] is True and bound["previous"] == "notes"
            assert (await control.diff())["tables"] == {}
            assert (await control.checksum())["pristine"] is True
            # room is made by the least recently used environment that is not served now
            made = await control.prepare("project_tracker")
            assert made["cached_envs"] == ["crm", "project_tracker"], made
            with pytest.raises(ControlApiError) as err:
                await control.prepare("no_such_env")
            assert err.value.status == 404
            async with httpx.AsyncClient() as client:
                text = (await client.get(handle.control_url + "/metrics")).text
                for body, status in (({"env": 7}, 400), ({}, 400), ({"env": "\ud800"}, 400)):
                    r = await client.post(handle.control_url + "/prepare", content=json.dumps(body),
                                          headers={"content-type": "application/json"})
                    assert r.status_code == status and "error" in r.json(), (body, r.text)
            assert _metric(text, "awm_prepares_total", outcome="made") == 2
            assert _metric(text, "awm_binds_total", kind="cached") == 1
            assert _metric(text, "awm_binds_total", kind="new") == 0
        finally:
            await mcp.close()
            await control.close()


async def test_a_pinned_instance_refuses_to_switch(admin_dsn, notes_bundle):
    async with LocalFleet([notes_bundle], database=Database(admin_dsn), allow_ungated=True, binding="pinned") as fleet:
        control = ControlClient(fleet.instances[0].control_url)
        try:
            with pytest.raises(ControlApiError) as err:
                await control.bind("crm")
            assert err.value.status == 409 and "pinned" in str(err.value)
            with pytest.raises(ControlApiError) as err:
                await control.prepare("crm")
            assert err.value.status == 409 and "pinned" in str(err.value)
            assert (await control.bind("notes"))["switched"] is False
        finally:
            await control.close()


async def test_a_crashed_instance_leaks_no_database(fleet, admin_dsn):
    handle = fleet.instances[1]
    held = handle.db.dbname
    os.kill(handle.pid, signal.SIGKILL)
    for _ in range(600):  # the fleet restarts it; its provisioner connection closed with it
        await asyncio.sleep(0.1)
        if handle.restarts and held not in provision.list_instances(admin_dsn):
            break
    assert held not in provision.list_instances(admin_dsn)
    for _ in range(600):
        await asyncio.sleep(0.1)
        control = ControlClient(handle.control_url)
        try:
            if await control.ready():
                break
        except Exception:  # noqa: BLE001 - still restarting
            pass
        finally:
            await control.close()
    control = ControlClient(handle.control_url)
    try:
        assert (await control.bind("crm"))["env"] == "crm"
    finally:
        await control.close()


def _umask_now() -> str:
    """This process's umask, read without setting it (os.umask can only set)."""
    return next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("Umask:"))


def test_provisioner_servers_starting_at_once_leave_the_process_umask_alone(admin_dsn, bundles, tmp_path):
    """Socket files come out 0600 without touching the umask, which is the whole process's: the
    servers once narrowed it around bind, and two starting together could leave the process at
    0o177 for good (later, Chromium started by the same pytest process crashed at start with its
    profile directories made 0600)."""
    before = _umask_now()
    provisioner = Provisioner(admin_dsn, {b.name: b for b in bundles}.__getitem__, "umasktest", keep=0)
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.add(_umask_now())

    def start_many(i: int) -> None:
        for j in range(20):
            server = ProvisionerServer(provisioner, tmp_path / f"{i}-{j}.sock")
            assert oct(os.stat(server.path).st_mode & 0o777) == "0o600"
            with socket.socket(socket.AF_UNIX) as raw:  # reachable at its path after the move
                raw.connect(server.path)
            server.server_close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        starters = [threading.Thread(target=start_many, args=(i,)) for i in range(4)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
    finally:
        done.set()
        watcher.join()
        provisioner.close()
    assert seen == {before} and _umask_now() == before, (before, seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{i}-{j}.sock" for i in range(4) for j in range(20))


def test_the_provisioner_hands_each_database_to_one_connection(admin_dsn, bundles, tmp_path):
    by_name = {b.name: b for b in bundles}

    def find(env: str):
        if env == "broken":
            raise ValueError("broken.json: invalid bundle")  # what awm.catalog.find raises for one
        return by_name[env]

    provisioner = Provisioner(admin_dsn, find, "provtest", keep=1)
    server = ProvisionerServer(provisioner, tmp_path / "p.sock").start()
    assert oct(os.stat(server.path).st_mode & 0o777) == "0o600"
    one, two = ProvisionerClient(server.path, "one"), ProvisionerClient(server.path, "two")
    try:
        got = one.acquire("notes")
        assert got.database in provision.list_instances(admin_dsn)
        with psycopg.connect(got.dsn, connect_timeout=5) as conn:  # the instance's own role reaches it
            assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] >= 0
            # The template's snapshot facts come with the database: what the instance would
            # otherwise read from it at its first connection.
            assert snapshot.Facts.from_json(got.facts) == snapshot.read_facts(conn)
        with pytest.raises(ValueError, match="malformed snapshot facts"):
            snapshot.Facts.from_json({**got.facts, "checksums": [["notes", "many", "1"]]})
        with pytest.raises(ProvisionerError, match="not a database of this connection"):
            two.release(got.database)  # never another instance's
        with pytest.raises(ProvisionerError, match="unknown environment"):
            two.acquire("../etc")
        with pytest.raises(ProvisionerError, match="cannot be loaded"):  # answered, the connection kept
            one.acquire("broken")
        assert got.database in provision.list_instances(admin_dsn)
        for line in (b"not json\n", b"[1]\n", b'{"op": "drop_everything"}\n', b'{"op": "acquire"}\n',
                     b'{"op": "prefill", "env": "notes", "count": 100000}\n'):
            with socket.socket(socket.AF_UNIX) as raw:
                raw.connect(server.path)
                raw.sendall(line)
                reply = json.loads(raw.makefile("rb").readline())
                assert reply["ok"] is False and reply["error"]
        with socket.socket(socket.AF_UNIX) as raw:  # an endless line is cut off, not buffered
            raw.connect(server.path)
            raw.sendall(b"x" * (200 * 1024))
            assert json.loads(raw.makefile("rb").readline())["ok"] is False
        # The next database of an environment in demand was made ahead: a claim only takes it.
        for _ in range(200):
            if provisioner.ready_count("notes"):
                break
            time.sleep(0.05)
        second = two.acquire("notes")
        assert second.ready is True and second.database != got.database
        two.close()  # a connection that closes (its instance exited) drops what it held
        _wait_dropped(admin_dsn, second.database, 5.0)
        one.release(got.database)  # answered at once, dropped right after
        _wait_dropped(admin_dsn, got.database)
    finally:
        one.close()
        two.close()
        server.close()
        provisioner.close()
    assert not [d for d in provision.list_instances(admin_dsn) if "provtest" in d]


def test_closing_with_the_database_server_gone_waits_for_one_connection(bundles, monkeypatch):
    """A provisioner that closes while its server is gone (a killed database pod) tried to drop
    each database it held on a connection of its own, each retried for a minute: a test's
    teardown hung for many minutes. It waits for one connection now, and leaves the rest to the
    fleet's sweep. (test_the_provisioner_hands_each_database_to_one_connection checks they go where the server
    is up.)"""
    import awm.postgres.provisioner as provisioner_module

    asked: list[float] = []
    real = provision._admin

    def admin(dsn: str, dbname: str | None = None, retry_s: float = provision.CONNECT_RETRY_S):  # noqa: ANN202
        asked.append(retry_s)
        return real(dsn, dbname, retry_s)

    monkeypatch.setattr(provision, "_admin", admin)
    monkeypatch.setattr(provisioner_module, "CLOSE_CONNECT_S", 0.5)
    with socket.socket() as s:  # a port nothing listens on: the server is gone
        s.bind(("127.0.0.1", 0))
        gone = f"postgresql://awm@127.0.0.1:{s.getsockname()[1]}/postgres"
    by_name = {b.name: b for b in bundles}
    provisioner = Provisioner(gone, by_name.__getitem__, "gonetest", keep=0)
    provisioner._made = {f"awm_gonetest_{i}": None for i in range(5)}  # type: ignore[misc]  # held at close
    provisioner.close()
    assert asked == [0.5]  # one connection asked for, not one per database


def test_a_whole_fleet_connecting_at_once_reaches_the_provisioner(admin_dsn, bundles, tmp_path):
    """Every instance of a fleet connects to the provisioner as it starts, all at once. With the
    socketserver default of 5 pending connections, the sixth got EAGAIN and its instance failed
    to start (seen with 16 instances). Here 48 connect while the provisioner is not accepting
    yet; all of them are answered once it is."""
    by_name = {b.name: b for b in bundles}
    provisioner = Provisioner(admin_dsn, lambda env: by_name[env], "rushtest", keep=0)
    server = ProvisionerServer(provisioner, tmp_path / "rush.sock")  # listening, not accepting
    clients = [ProvisionerClient(server.path, f"i{n}") for n in range(48)]
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            connecting = [pool.submit(c.request, {"op": "prefill", "env": "notes", "count": 0}) for c in clients]
            time.sleep(0.5)
            server.start()
            assert all(f.result(timeout=60)["ok"] for f in connecting)
    finally:
        for client in clients:
            client.close()
        server.close()
        provisioner.close()


def test_the_provisioner_on_an_abstract_name_answers_its_own_uid_only(admin_dsn, bundles):
    """An env pod's sidecar listens on ``@name`` (abstract: no file, shared by the pod's network
    namespace under runc and gVisor). There is no file mode to keep other users out, so each
    connection's peer uid is checked: another uid gets no answer and the connection is closed."""
    by_name = {b.name: b for b in bundles}
    name = f"@awm-provtest-{os.getpid()}"
    provisioner = Provisioner(admin_dsn, by_name.__getitem__, "provabs")
    server = ProvisionerServer(provisioner, name).start()
    client = ProvisionerClient(name, "abs")
    try:
        got = client.acquire("notes")
        assert got.database in provision.list_instances(admin_dsn)
        if os.geteuid() == 0:  # another uid (root can become one): refused before any request is read
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                answer = b"no answer"
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    with socket.socket(socket.AF_UNIX) as raw:
                        raw.settimeout(10)
                        raw.connect("\0" + name[1:])
                        try:
                            raw.sendall(b'{"op": "acquire", "env": "notes"}\n')
                            answer = raw.recv(4096) or b"closed"
                        except (ConnectionResetError, BrokenPipeError):  # closed before it read our line
                            answer = b"closed"
                except BaseException as exc:  # noqa: BLE001 - said to the parent's assertion
                    answer = repr(exc).encode()
                finally:
                    os.write(write, answer)
                    os._exit(0)
            os.close(write)
            answer = os.read(read, 4096)
            os.close(read)
            os.waitpid(pid, 0)
            assert answer == b"closed", answer
        client.release(got.database)
        _wait_dropped(admin_dsn, got.database)
    finally:
        client.close()
        server.close()
        provisioner.close()
    assert not [d for d in provision.list_instances(admin_dsn) if "provabs" in d]


async def test_claims_bind_free_instances_to_the_environment_asked_for(admin_dsn, bundles):
    """The claim path (awm.episode.sources): a claim of an environment no free instance serves
    switches a free late-binding one; a GRPO group switches its instances at once."""
    source = LocalFleetSource(bundles, replicas=1, database=Database(admin_dsn), allow_ungated=True,
                              instances=3)
    async with source:
        assert source.envs() == sorted(b.name for b in bundles) and source.capacity("crm") == 3
        group = await source.claim_group("crm", 3)
        assert len(group) == 3 and {lease.env for lease in group} == {"crm"}
        assert source.switches == 2  # one instance started on crm
        for lease in group:
            assert {t["name"] for t in lease.handle.tools} == {t.name for t in bundles[1].tools}
            assert (await lease.handle.control.info())["env"] == "crm"
        controls = {lease.name: lease.handle.control for lease in group}
        await source.release(group)
        lease = await source.claim("notes")
        assert lease.env == "notes" and (await lease.handle.control.reset("add_note"))["env"] == "notes"
        # the switch kept the lease's control client and opened a new MCP session (the old one ended)
        assert lease.handle.control is controls[lease.name]
        notes_tools = {t.name for t in next(b for b in bundles if b.name == "notes").tools}
        assert {t["name"] for t in await lease.handle.mcp.list_tools()} == notes_tools
        await source.release(lease)
        again = await source.claim("notes")  # the one that serves notes now: no switch
        assert again.name == lease.name and source.switches == 3
        # a bind to what it serves already switches nothing, and its MCP session lives on
        session = again.handle.mcp._headers["Mcp-Session-Id"]
        assert (await again.bind("notes"))["switched"] is False
        assert again.handle.mcp._headers["Mcp-Session-Id"] == session and await again.handle.mcp.list_tools()
        await source.release(again)


async def test_a_switch_prefers_an_instance_that_keeps_the_environment_cached():
    """A claim of an environment no free instance serves takes, among free late-binding ones, one
    whose last /bind said it keeps that environment cached (a reset there, not a new database);
    else one from the environment with the most free."""
    def lease(env: str, name: str, cached: set[str]) -> Lease:
        return Lease(env, name, "http://127.0.0.1:1/mcp", "http://127.0.0.1:2", late=True, cached=frozenset(cached))

    source = PoolSource([lease("a", "i0", {"a", "x"}), lease("b", "i1", {"b"}), lease("b", "i2", {"b"})],
                        catalog={"a": "", "b": "", "x": "", "y": ""})
    assert source._steal("x").name == "i0"   # cached there, though b has more free
    assert source._steal("y").name in ("i1", "i2")  # cached nowhere: the most free
    assert source.free() == 1


async def test_awm_serve_json_lines_say_what_can_be_switched_to(tmp_path):
    lines = tmp_path / "serve.jsonl"
    lines.write_text(json.dumps({"env": "a", "instance": "i0", "mcp_url": "http://127.0.0.1:1/mcp",
                                 "control_url": "http://127.0.0.1:2", "late_binding": True, "catalog": ["a", "b"]}))
    source = PoolSource.from_json_lines(lines)
    assert source.envs() == ["a", "b"] and source.late and source.capacity("b") == 1
    assert isinstance(source._all[0], Lease)


async def test_grpo_groups_over_more_environments_than_instances(admin_dsn, bundles):
    """The trainer's rollouts on a late-binding fleet: three environments, two instances; every
    group's instances are switched to its environment and start from the verified snapshot."""
    from awm.episode.reward import RewardConfig
    from awm.trainer.agent import AgentConfig
    from awm.trainer.policy import ReplayPolicy
    from awm.trainer.rollout import RolloutConfig, RolloutService, TaskRef

    tasks = [TaskRef(b.name, b.tasks[0].id) for b in bundles]
    source = LocalFleetSource(bundles, replicas=1, database=Database(admin_dsn), allow_ungated=True, instances=2)
    async with source:
        svc = RolloutService(source, ReplayPolicy(bundles), tasks, AgentConfig(max_turns=8, verify_reset=True),
                             RewardConfig(), RolloutConfig(group_size=2, seed=3))
        groups = await svc.collect(6)  # each task twice
        assert sorted(g.task.env for g in groups) == sorted([b.name for b in bundles] * 2)
        for group in groups:
            assert len(group.trajectories) == 2 and all(t.pristine for t in group.trajectories), (
                group.task, [(t.instance, t.pristine, t.verdict, t.mask_reason, t.infra_error) for t in group.trajectories])
            assert {t.verdict["verdict"] for t in group.trajectories} == {"complete"}, (
                group.task, [(t.instance, t.verdict, [m for m in t.messages if m.get("role") == "tool"])
                             for t in group.trajectories])
        # the two instances served all three environments
        assert source.switches >= 4, (source.switches, [(g.task.env, [t.instance for t in g.trajectories]) for g in groups])


async def test_a_local_fleet_makes_the_databases_of_environments_told_ahead(admin_dsn, bundles):
    """InstanceSource.prepare on a local late-binding fleet: its provisioner makes databases of
    the environments told (one per instance to be claimed), and the switch that follows takes a
    made one instead of cloning on the claim path."""
    source = LocalFleetSource(bundles, replicas=1, database=Database(admin_dsn), allow_ungated=True, instances=2)
    async with source:
        provisioner = source.fleet.provisioner
        assert "project_tracker" not in {h.env for h in source.fleet.instances}
        await source.prepare({"project_tracker": 16})  # as many as the fleet has instances: 2
        deadline = time.monotonic() + 60
        while provisioner.ready_count("project_tracker") < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert provisioner.ready_count("project_tracker") == 2
        hits = provisioner.stats["ready_hits"]
        lease = await source.claim("project_tracker")
        try:
            assert lease.env == "project_tracker" and provisioner.stats["ready_hits"] == hits + 1
        finally:
            await source.release(lease)
        await source.prepare({"no_such_env": 1})  # a hint: an unknown environment is no failure


def test_an_instance_keeps_the_series_of_its_most_recently_served_environments() -> None:
    """Metrics of a late-binding instance stay bounded: the series of an environment served more
    than ``served_envs`` switches ago are removed (its tools', episodes', info), the recent ones kept."""
    from prometheus_client import generate_latest

    from awm.envserver.metrics import Metrics

    m = Metrics("e0", "i0", served_envs=3)
    for i in range(1, 6):
        m.tool_calls.labels(f"e{i - 1}", "tool", "ok").inc()
        m.tool_latency.labels(f"e{i - 1}", "tool").observe(0.001)
        m.bound(f"e{i - 1}", f"e{i}")
    text = generate_latest(m.registry).decode()
    for gone in ("e0", "e1", "e2"):
        assert f'env="{gone}"' not in text, gone
    for kept in ("e3", "e4", "e5"):
        assert f'awm_instance_info{{env="{kept}"' in text
    assert 'awm_tool_calls_total{env="e4",outcome="ok",tool="tool"} 1.0' in text
    m.bound("e5", "e3")  # served again: the most recent, nothing of it lost
    assert 'env="e3"' in generate_latest(m.registry).decode()


# --------------------------------------------------------------------------- spares shared by a pool


def _spares(admin_dsn: str, pool: Spares | None = None) -> list[str]:
    """Spare databases on the server (of one pool's ``pool`` if given), in no order."""
    start = f"{SPARE}{pool.pool}_" if pool else SPARE
    return [d for d in provision.list_instances(admin_dsn) if d.startswith(start)]


def test_a_spare_made_by_one_pods_provisioner_is_taken_by_anothers(admin_dsn, bundles):
    """Two provisioners of one pool (two pods of a fleet): a claim of an environment on the
    first leaves a spare of it on the server; the second's claim of it takes that spare (renamed
    to its own instance, with a role that reaches only it, at the template's checksum) instead of
    cloning; a provisioner of another pool never takes it; the operator's sweep of gone pods
    leaves spares, the fleet's finalizer listing has them."""
    by_name = {b.name: b for b in bundles}
    meta = {"fleet": "sparetest", "namespace": "ns-spares"}
    make = (lambda prefix, pool, spares=8: Provisioner(admin_dsn, by_name.__getitem__, prefix, keep=0,
                                                       meta={**meta, "pod": prefix}, max_spares=spares, pool=pool))
    one, two, other = make("sparepoda", "pool-a"), make("sparepodb", "pool-a"), make("sparepodc", "pool-b")
    try:
        first = one.acquire("crm", "a")
        assert (first.ready, first.spare, first.verified) == (False, False, False)  # nothing made ahead yet: a clone
        (spare,) = wait_for("a spare of crm", lambda: _spares(admin_dsn, one.spares), interval=0.05)
        with pytest.raises(psycopg.OperationalError, match="permission denied"):  # no instance reaches a spare
            psycopg.connect(first.dsn.replace(f"dbname={first.database}", f"dbname={spare}"), connect_timeout=5).close()
        taken = two.acquire("crm", "b")
        assert (taken.ready, taken.spare, taken.verified) == (True, True, True)  # checksummed by its maker
        assert taken.database.startswith(provision.INSTANCE_PREFIX) and spare not in provision.list_instances(admin_dsn)
        with psycopg.connect(taken.dsn, connect_timeout=5) as conn:
            assert snapshot.compute_checksum(conn).digest == taken.checksum
            assert conn.execute("SELECT current_user").fetchone()[0] == taken.database
        with pytest.raises(psycopg.OperationalError):  # its role reaches its own database only
            psycopg.connect(taken.dsn.replace(f"dbname={taken.database}", f"dbname={first.database}"),
                            connect_timeout=5).close()
        comment = provision.instances_with_meta(admin_dsn)[taken.database]
        assert (comment["pod"], comment.get("spare")) == ("sparepodb", None)  # the taker's, no longer a spare
        # the next spare of crm was made again (by either), and another pool's claim clones
        (again,) = wait_for("the next spare of crm", lambda: _spares(admin_dsn, one.spares), interval=0.05)
        assert again != spare
        cloned = other.acquire("crm", "c")
        assert (cloned.ready, cloned.spare, cloned.verified) == (False, False, False) and again in _spares(admin_dsn)
        # the operator: a sweep of gone pods keeps the fleet's spares; its finalizer's listing has them
        from awm_operator import databases

        listed = databases.fleet_databases(admin_dsn, "ns-spares", "sparetest")
        assert listed[again] == "" and listed[taken.database] == "sparepodb"
        gone = databases.drop_orphans(admin_dsn, "ns-spares", "sparetest", live_pods={"sparepodb", "sparepodc"})
        assert first.database in gone and again not in gone and again in provision.list_instances(admin_dsn)
        assert one.stats["clones_on_claim"] == 1 and two.stats["spare_hits"] == 1
    finally:
        for p in (one, two, other):
            p.close()
        for name in _spares(admin_dsn):
            provision.drop_instance(admin_dsn, name)


def test_a_spare_is_checksummed_by_its_maker_and_its_taker_trusts_that_once(admin_dsn, bundles):
    """A spare's maker checksums the copy against the template's snapshot: one that differs is
    dropped, never published. A taken spare says so (``verified``), and its env server's first
    verifying reset takes the maker's checksum as its own: that reset trusts it (here the database
    was changed behind everyone's back, as the admin, which no instance role can do to a spare),
    and the next verifying reset checks again and restores."""
    import dataclasses

    from envserver.reset import EpisodeDatabase

    by_name = {b.name: b for b in bundles}
    maker = Provisioner(admin_dsn, by_name.__getitem__, "sparechk", keep=0, meta={"pod": "sparechk"},
                        max_spares=4, pool="pool-check")
    try:
        template = maker.template("crm")
        facts = snapshot.Facts.from_json(template.facts)
        table, (count, digest) = next((t, v) for t, v in sorted(facts.expected.tables.items()) if v[0] > 0)
        wrong = dataclasses.replace(facts.expected, tables={**facts.expected.tables, table: (count + 1, digest)})
        bad = dataclasses.replace(template, facts=dataclasses.replace(facts, expected=wrong).to_json())
        assert maker.spares is not None
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            with pytest.raises(RuntimeError, match="differs from its snapshot"):
                maker.spares.make(conn, bad, {"pod": "sparechk"}, None)
        assert _spares(admin_dsn, maker.spares) == [] and not [
            d for d in provision.list_instances(admin_dsn) if d.startswith(maker.spares.prefix(template, making=True))]

        maker._make_spare("crm")
        assert len(_spares(admin_dsn, maker.spares)) == 1
        taken = maker.acquire("crm", "x")
        assert (taken.spare, taken.verified) == (True, True)
        with provision._admin(admin_dsn, taken.database) as admin:  # behind everyone's back
            admin.execute(f'TRUNCATE "{table}" CASCADE')
        db = EpisodeDatabase(taken.dsn, facts=snapshot.Facts.from_json(taken.facts), verified=True)
        db.connect()
        try:
            assert db.vouched
            first = db.reset(verify=True)
            assert first.pristine is True and first.strategy == "rollback" and not db.vouched
            second = db.reset(verify=True)
            assert second.strategy == "restore" and table in second.repaired and second.pristine is True
            assert db.mismatches() == []
        finally:
            db.close()
    finally:
        maker.close()
        for name in _spares(admin_dsn):
            provision.drop_instance(admin_dsn, name)


def test_spares_are_bounded_and_a_group_claim_makes_one_of_each(admin_dsn, bundles):
    """Eight claims at once of one environment on four provisioners of a pool (a GRPO group on
    four pods) each get their own database and leave one spare, not eight; spares beyond the
    pool's bound are dropped oldest first; one left half-made by a dead maker goes once stale."""
    by_name = {b.name: b for b in bundles}
    pods = [Provisioner(admin_dsn, by_name.__getitem__, f"sparegrp{i}", keep=0, meta={"pod": f"p{i}"},
                        max_spares=2, pool="pool-group") for i in range(4)]
    try:
        with ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda i: pods[i % 4].acquire("project_tracker", f"g{i}"), range(8)))
        assert len({g.database for g in got}) == 8
        wait_for("a spare of project_tracker", lambda: _spares(admin_dsn, pods[0].spares), interval=0.05)
        for p in pods:  # every queued look has run: none made a second
            p._spare_jobs.submit(lambda: None).result(timeout=30)
        assert len(_spares(admin_dsn, pods[0].spares)) == 1
        # two more environments: three spares for a bound of two, the oldest (project_tracker's) dropped
        pods[0].acquire("notes", "n")
        wait_for("a spare of notes", lambda: len(_spares(admin_dsn, pods[0].spares)) == 2, interval=0.05)
        pods[1].acquire("crm", "c")
        def spare_envs() -> list[str]:  # one listing: a spare may be dropped between two
            start = f"{SPARE}{pods[0].spares.pool}_"
            return sorted(m["env"] for n, m in provision.instances_with_meta(admin_dsn).items() if n.startswith(start))

        wait_for("a spare of crm", lambda: "crm" in spare_envs(), interval=0.05)
        pods[1]._spare_jobs.submit(lambda: None).result(timeout=30)  # its trim has run
        assert spare_envs() == ["crm", "notes"]
        assert all(made_at(n) for n in _spares(admin_dsn, pods[0].spares))
        # a spare half made by a maker that died (no comment, an old time in its name) is dropped
        stale = pods[0].spares.prefix(pods[0].template("notes"), making=True) + f"{int((time.time() - 3600) * 1000):011x}_dead"
        with provision._admin(admin_dsn) as conn:
            conn.execute(provision.clone_statement(pods[0].template("notes"), stale))
            assert stale in pods[0].spares.trim(conn)
    finally:
        for p in pods:
            p.close()
        for name in _spares(admin_dsn):
            provision.drop_instance(admin_dsn, name)


def test_a_fleets_spares_without_a_comment_still_go_with_the_fleet(admin_dsn, bundles):
    """A spare being made whose maker was killed before writing its comment is found by its name
    (the fleet's pool is in it): the fleet's finalizer drops it, the sweep of gone pods does not."""
    from awm_operator import databases

    from awm.postgres.spares import fleet_pool

    by_name = {b.name: b for b in bundles}
    provisioner = Provisioner(admin_dsn, by_name.__getitem__, "nocomment", keep=0)
    spares = Spares(admin_dsn, fleet_pool("ns-nc", "fleet-nc"), 4)
    template = provisioner.template("notes")
    orphan = spares.prefix(template, making=True) + f"{int(time.time() * 1000):011x}_dead"
    try:
        with provision._admin(admin_dsn) as conn:
            conn.execute(provision.clone_statement(template, orphan))
        assert databases.fleet_databases(admin_dsn, "ns-nc", "fleet-nc") == {orphan: ""}
        assert databases.fleet_databases(admin_dsn, "ns-nc", "other") == {}
        assert databases.drop_orphans(admin_dsn, "ns-nc", "fleet-nc", live_pods=set()) == []
        databases.drop(admin_dsn, list(databases.fleet_databases(admin_dsn, "ns-nc", "fleet-nc")))
        assert orphan not in provision.list_instances(admin_dsn)
    finally:
        provision.drop_instance(admin_dsn, orphan)
        spares.close()
        provisioner.close()


def test_a_release_during_a_postgres_restart_is_dropped_once_it_is_back(tmp_path, notes_bundle):
    """Found by the soak: a release whose DROP met the server restarting was never tried again,
    and the database stayed made and held by nobody until the fleet stopped. The provisioner
    tries it again until the server is back."""
    from awm.postgres.server import EmbeddedPostgres

    pg = EmbeddedPostgres(tmp_path / "postgres")
    pg.start()
    provisioner = Provisioner(pg.admin_dsn(), {notes_bundle.name: notes_bundle}.__getitem__, "droptest", keep=0)
    try:
        got = provisioner.acquire("notes")
        assert got.database in provision.list_instances(pg.admin_dsn())
        pg.stop()
        provisioner.release_later(got.database)
        time.sleep(2.0)  # its first tries fail: the server is down
        pg.start()
        wait_for("the released database dropped once the server is back",
                 lambda: got.database not in provision.list_instances(pg.admin_dsn()), 60)
        assert provisioner.stats["released"] == 1
    finally:
        provisioner.close()
        pg.stop()
