"""The sandbox workers themselves (awm.sandbox): confinement, the protocol's rules, and the server
side's refusal to trust a worker. The attacks, served through real instances, are in
test_redteam.py."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import signal
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future

import pytest

from awm.bundle import EnvBundle
from awm.sandbox import codec, confine
from awm.sandbox.forkserver import Zygote
from awm.sandbox.pool import WeakIsolation, WorkerFailure, WorkerPool, WorkerSpec, redact


def _pool(tools: dict[str, str], **spec) -> WorkerPool:
    pool = WorkerPool(WorkerSpec(load={"prelude": "", "tools": [{"name": k, "code": v} for k, v in tools.items()]},
                                 **spec))
    pool.start()
    return pool


def _no_sql(message):
    return {"error": {"kind": "forbidden", "message": "no database in this test"}}


def test_this_machine_confines_workers_with_every_required_layer():
    """Seccomp and a file rule are what the server insists on; on this machine (and in CI) they
    must be there, or every env server refuses to run code. Where the kernel has Landlock it is
    applied; under gVisor (no Landlock) the file view is the file rule."""
    report = confine.probe()
    assert report.strong, report.missing
    pool = _pool({"ok": "def ok(db):\n    return 1"})
    try:
        assert pool.isolation["strong"] is True
        applied = set(pool.isolation["applied"])
        assert {"rlimits", "seccomp"} <= applied and applied & {"landlock", "fsview"}, applied
        if confine.landlock_abi():
            assert "landlock" in applied
    finally:
        pool.close()


_VIEW_PROBE = '''
def probe(db):
    import os
    try:
        out = {"root": sorted(os.listdir("/"))}
    except OSError as exc:
        out = {"root": type(exc).__name__}
    for i, path in enumerate(SECRETS):  # by index: the worker's output has host paths redacted
        try:
            with open(path) as f:
                f.read(1)
            out[f"secret{i}"] = "read"
        except OSError as exc:
            out[f"secret{i}"] = type(exc).__name__
    for i, path in enumerate(("/planted", os.path.dirname(os.__file__) + "/planted.py")):
        try:
            open(path, "w").close()
            out[f"create{i}"] = "created"
        except OSError as exc:
            out[f"create{i}"] = type(exc).__name__
    import datetime, decimal, sqlite3, statistics, zoneinfo  # imported late: the standard library is in the view
    out["tz"] = str(datetime.datetime(2026, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")).utcoffset())
    return out
'''


@pytest.mark.parametrize("layers", ["namespaces,fsview,rlimits,seccomp", ",".join(confine.LAYERS)])
def test_the_file_view_keeps_every_file_out_of_reach_without_landlock(layers, monkeypatch, tmp_path):
    """The file view (a mount namespace whose read-only root holds only the read paths) is the file
    rule where Landlock is missing (gVisor); on this machine it is applied beside Landlock. Either
    way a worker reads nothing else (a credential file, the project's code, /etc, /proc), creates
    nothing (the next worker would see it), and the standard library and time zones still load."""
    secret = tmp_path / "dsn"
    secret.write_text("postgresql://awm:secret@db/awm")
    secrets = [str(secret), os.path.abspath(confine.__file__), "/etc/passwd", "/proc/self/environ", "/proc/1/cmdline"]
    monkeypatch.setenv("AWM_SANDBOX_LAYERS", layers)
    pool = _pool({"probe": f"SECRETS = {secrets!r}\n" + _VIEW_PROBE})
    try:
        assert pool.isolation["strong"] is True, pool.isolation
        assert "fsview" in pool.isolation["applied"], pool.isolation
        reply = pool.run({"op": "call", "tool": "probe", "arguments": {}}, _no_sql, 30)
        assert "value" in reply, reply
        out = reply["value"]
    finally:
        pool.close()
    # the view's own directories are search-only and the worker holds no capability: no listing
    assert out["root"] == "PermissionError", out
    assert all(out[f"secret{i}"] in ("FileNotFoundError", "PermissionError") for i in range(len(secrets))), out
    assert not any(v == "created" for v in out.values()), out
    assert out["tz"] == "1:00:00", out


def test_missing_layers_are_refused_unless_accepted(monkeypatch):
    monkeypatch.setenv("AWM_SANDBOX_LAYERS", "rlimits")
    pool = WorkerPool(WorkerSpec(load={"prelude": "", "tools": []}))
    with pytest.raises(WeakIsolation, match="landlock"):
        pool.start()
    pool.close()
    weak = _pool({"ok": "def ok(db):\n    return 1"}, allow_weak_isolation=True)
    try:
        assert weak.isolation["strong"] is False and "seccomp" in weak.isolation["missing"]
        assert weak.run({"op": "call", "tool": "ok", "arguments": {}}, _no_sql, 5)["value"] == 1
    finally:
        weak.close()


def test_a_worker_that_speaks_out_of_turn_is_replaced_before_the_next_call():
    """A signal handler armed by one call writes SQL on the pipe later: nothing it sends between
    calls is executed, and the worker is replaced."""
    arm = '''
def arm(db):
    import signal, sys
    w = sys.modules["awm.sandbox.worker"]
    ch = sys.modules["awm.sandbox.channel"]
    signal.signal(signal.SIGALRM, lambda *a: ch.CHANNEL.send({"op": "sql", "sql": "DELETE FROM t", "params": [], "fetch": "none"}))
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    return "armed"
'''
    pool = _pool({"arm": arm, "ok": "def ok(db):\n    return 'ok'"})
    seen = []

    def record(message):
        seen.append(message)
        return {"rowcount": 0}

    try:
        assert pool.run({"op": "call", "tool": "arm", "arguments": {}}, record, 5)["value"] == "armed"
        first = pool.pids()
        deadline = time.monotonic() + 5
        while pool._used.qsize() and pool._used.queue[0].quiet() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.run({"op": "call", "tool": "ok", "arguments": {}}, record, 5)["value"] == "ok"
        assert seen == [] and pool.replaced == 1 and pool.pids() != first
    finally:
        pool.close()


def _gone(pid: int) -> bool:
    """The process has exited (a zombie until its parent, the fork server, reaps it)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_renewed_worker_stops_at_once_and_is_replaced_off_the_answers_path():
    """At a new episode the last one's worker is stopped at once (its process is gone, whatever
    its code left running), before any fork; its replacement starts when the server says its
    answer is out (``replace_retired``), or at the next call if nobody said so."""
    pool = WorkerPool(WorkerSpec(load={"prelude": "", "tools": [
        {"name": "pid", "code": "def pid(db):\n    import os\n    return os.getpid()"}]}), spares=1)
    pool.start()
    try:
        def call() -> int:
            return pool.run({"op": "call", "tool": "pid", "arguments": {}}, _no_sql, 5)["value"]

        assert len(pool.pids()) == 2  # the worker and its spare
        used = call()
        pool.renew()
        assert [w.pid for w in pool._retired] == [used] and used not in pool.pids()
        assert pool.ready  # the spare serves the next episode; a replacement is due
        deadline = time.monotonic() + 5
        while not _gone(used):
            assert time.monotonic() < deadline, "the renewed worker still runs"
            time.sleep(0.01)
        assert len(pool.pids()) == 1  # and nothing was forked yet
        pool.replace_retired()
        for future in list(pool._pending):
            future.result(10)
        assert len(pool.pids()) == 2 and not pool._retired
        second = call()
        assert second != used
        pool.renew()  # nobody calls replace_retired: the next call starts the replacement
        assert call() not in (used, second)
        for future in list(pool._pending):
            future.result(10)
        assert len(pool.pids()) == 2
    finally:
        pool.close()


def test_a_pool_starts_when_told_after_what_it_waits_for_or_at_its_first_call():
    """A switch makes its pools without forking (the answer goes out first); a pool started
    ``after`` another spawn forks only once that is done; an unstarted pool forks at its first
    call."""
    spec = WorkerSpec(load={"prelude": "", "tools": [{"name": "ok", "code": "def ok(db):\n    return 'ok'"}]})
    gate: Future[None] = Future()
    waiting, lazy = WorkerPool(spec), WorkerPool(spec)
    try:
        assert waiting.start(wait=False, after=gate) is not None
        assert waiting.start(wait=False) is None  # a pool starts once
        time.sleep(0.3)
        assert waiting.pids() == [] and waiting.ready
        gate.set_result(None)
        deadline = time.monotonic() + 10
        while not waiting.pids():
            assert time.monotonic() < deadline, "the pool did not start after its gate"
            time.sleep(0.02)
        assert lazy.ready and not lazy.started and lazy.pids() == []
        assert lazy.run({"op": "call", "tool": "ok", "arguments": {}}, _no_sql, 5)["value"] == "ok"
        assert lazy.started
    finally:
        waiting.close()
        lazy.close()


def test_a_fork_server_keeps_the_most_recent_loads_and_is_sent_a_dropped_one_again():
    """A late-binding instance serves many environments over its life: its fork server keeps the
    code of the most recent few (``max_loads``), and a spawn for one it dropped sends it again."""
    from awm.sandbox.pool import Worker, make_zygote

    zygote = make_zygote(False)
    zygote.close()
    zygote = Zygote(zygote._config["sys_path"], zygote._config["drop_paths"], False, zygote._config["layers"],
                    zygote._config["read_paths"], max_loads=2)
    specs = [WorkerSpec(load={"prelude": "", "tools": [{"name": "which", "code": f"def which(db):\n    return {i}"}]})
             for i in range(4)]
    try:
        for i in (0, 1, 2, 3, 0, 3, 1):  # 0 and 1 were dropped by the time they come again
            worker = Worker(specs[i], zygote)
            try:
                assert worker.request({"op": "call", "tool": "which", "arguments": {}}, _no_sql, 5)["value"] == i
            finally:
                worker.kill()
        assert list(zygote._envs[None].loads) == [specs[3].load_key, specs[1].load_key]
        # A fork server that died (killed, out of memory) is started again holding nothing, and
        # one that lost track of a load says so: either way the load is sent again.
        os.kill(zygote.pid(), signal.SIGKILL)
        zygote._proc.wait()
        zygote._envs[None].loads = OrderedDict((s.load_key, None) for s in specs)  # a server out of step with it
        for i in (3, 2):
            worker = Worker(specs[i], zygote)
            try:
                assert worker.request({"op": "call", "tool": "which", "arguments": {}}, _no_sql, 5)["value"] == i
            finally:
                worker.kill()
        zygote._envs[None].loads = OrderedDict((s.load_key, None) for s in specs)
        worker = Worker(specs[0], zygote)  # the running zygote holds 3 and 2, not 0
        try:
            assert worker.request({"op": "call", "tool": "which", "arguments": {}}, _no_sql, 5)["value"] == 0
        finally:
            worker.kill()
    finally:
        zygote.close()


@pytest.mark.parametrize("code, kind", [
    ("def t(db):\n    while True:\n        pass", "timeout"),
    ("def t(db):\n    import os\n    os._exit(3)", "crash"),
])
def test_a_looping_or_dying_worker_is_killed_and_replaced(code, kind):
    pool = _pool({"t": code, "ok": "def ok(db):\n    return 'ok'"})
    try:
        with pytest.raises(WorkerFailure) as failure:
            pool.run({"op": "call", "tool": "t", "arguments": {}}, _no_sql, 1)
        assert failure.value.kind == kind
        assert pool.run({"op": "call", "tool": "ok", "arguments": {}}, _no_sql, 5)["value"] == "ok"
        assert pool.replaced == 1
    finally:
        pool.close()


def test_workers_die_with_their_server():
    """A worker asks the kernel for SIGKILL when the process that started it dies."""
    import subprocess
    import sys

    script = ("from awm.sandbox.pool import WorkerPool, WorkerSpec\n"
              "p = WorkerPool(WorkerSpec(load={'prelude': '', 'tools': []}))\n"
              "p.start()\n"
              "print(p.pids()[0], flush=True)\n"
              "import time; time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker_pid = int(parent.stdout.readline())
    assert os.path.exists(f"/proc/{worker_pid}")
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{worker_pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = not os.path.exists(f"/proc/{worker_pid}") or "Z" in open(f"/proc/{worker_pid}/stat").read().split()[2]
    assert gone, "the worker outlived its server"


def test_host_paths_are_redacted_from_worker_output():
    import sys

    pool = _pool({"paths": "def paths(db):\n    import sys, json\n    return [sys.path, json.__file__]"})
    try:
        value = pool.run({"op": "call", "tool": "paths", "arguments": {}}, _no_sql, 5)["value"]
    finally:
        pool.close()
    text = repr(value)
    assert sys.base_prefix not in text and "<host>" in text
    assert redact({"a": [f"{sys.prefix}/x"]}, [sys.prefix]) == {"a": ["<host>/x"]}


def test_codec_keeps_database_types():
    values = {"ts": dt.datetime(2026, 1, 2, 3, 4, 5, 6), "d": dt.date(2026, 1, 2), "t": dt.time(3, 4),
              "dur": dt.timedelta(seconds=1.5), "dec": decimal.Decimal("19.90"), "id": uuid.uuid4(),
              "raw": b"\x00\xff", "json": codec.JsonParam({"a": [1]}, True), "plain": [1, "x", None, 2.5]}
    assert codec.decode(codec.encode(values)) == values
    with pytest.raises(ValueError):
        codec.decode(b'{"x": {"$t": "pickle", "v": "..."}}')
    with pytest.raises(ValueError):
        codec.decode(b"[1, 2]")


async def test_synthesis_reports_hostile_tools_as_repairable_errors(admin_dsn, notes_bundle, monkeypatch):
    """`awm gen` validates generated tools in the same confined workers: a tool that loops, forks,
    allocates 10 GB or exits is an error for the next repair attempt, the run goes on, and the
    LLM key in the synthesising process never reaches the code."""
    from awm.bundle import Tool
    from awm.synth.validate import check_tools

    monkeypatch.setenv("AWM_LLM_API_KEY", "sk-synth-must-not-leak")
    hostile = {
        "loops": "def loops(db):\n    while True:\n        pass",
        "forks": "def forks(db):\n    import os\n    return os.fork()",
        "allocates": "def allocates(db):\n    return len(bytearray(10 * 1024 ** 3))",
        "exits": "def exits(db):\n    import os\n    os._exit(0)",
        "reads_key": "def reads_key(db):\n    import os\n    return dict(os.environ)",
    }
    tools = [Tool(name=name, description=name, input_schema={"type": "object", "properties": {}}, code=code)
             for name, code in hostile.items()]
    bundle = EnvBundle.model_validate({**notes_bundle.model_dump(), "tools": [t.model_dump() for t in tools], "tasks": [],
                                       "limits": {**notes_bundle.limits.model_dump(), "tool_timeout_s": 2}})
    errors = await check_tools(admin_dsn, bundle, {name: {} for name in hostile})
    text = "\n".join(errors)
    for name in ("loops", "forks", "allocates", "exits"):
        assert any(e.startswith(f"{name}(") for e in errors), text
    assert "timeout" in text and "MemoryError" in text and "Operation not permitted" in text
    assert "sk-synth-must-not-leak" not in text and not any(e.startswith("reads_key(") for e in errors)


def test_no_open_file_description_is_shared_between_workers():
    """A worker's descriptors 0-2 are its own: status flags a tool sets on them, or an
    open-file-description lock it takes, are not what a later episode's worker finds (they were
    the fork server's /dev/null, one description shared by every worker of every environment)."""
    code = ("def mark(db):\n"
            "    import fcntl, os, struct\n"
            "    found = {fd: fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK for fd in (0, 1, 2)}\n"
            "    for fd in (0, 1, 2):\n"
            "        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)\n"
            "    lock = struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0)\n"
            "    try:\n"
            "        fcntl.fcntl(0, 38, lock)  # F_OFD_SETLK\n"
            "        locked = 'took'\n"
            "    except OSError as exc:\n"
            "        locked = f'refused: {exc.errno}'\n"
            "    return {'nonblock_found': sorted(fd for fd, v in found.items() if v), 'lock': locked}")
    pool = WorkerPool(WorkerSpec(load={"prelude": "", "tools": [{"name": "mark", "code": code}]}), spares=1)
    pool.start()
    try:
        seen = []
        for _ in range(3):  # three episodes, each on a fresh worker
            seen.append(pool.run({"op": "call", "tool": "mark", "arguments": {}}, _no_sql, 5)["value"])
            pool.renew()
            pool.replace_retired()
        assert [s["nonblock_found"] for s in seen] == [[], [], []], seen
        assert all(s["lock"] in ("took", "refused: 1", "refused: 22") for s in seen), seen  # never EAGAIN: held by another
    finally:
        pool.close()
