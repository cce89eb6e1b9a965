"""A local fleet killed before it could clean up leaves instance databases behind; the next fleet
on the host (or ``awm postgres gc``) drops them, and never those of a fleet that is alive. It
leaves no process behind: its env servers and their workers exit when it dies (awm.envserver.lifeline)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from typer.testing import CliRunner

from awm.cli import app
from awm.fleet import Database, LocalFleet, owner_meta, reap_abandoned
from awm.postgres import provision

CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from awm.bundle import EnvBundle
    from awm.fleet import Database, LocalFleet

    async def main():
        bundle = EnvBundle.model_validate_json(open(sys.argv[2]).read())
        fleet = LocalFleet([bundle], replicas=2, database=Database(sys.argv[1]), fleet_id="killed",
                           verifier_workers=2)
        await fleet.start()
        # the env servers, and the template their fork servers are forked from (a late-binding fleet's)
        template = [fleet._template.pid] if fleet._template is not None else []
        print(json.dumps([h.pid for h in fleet.instances] + template), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")
GONE_WITHIN_S = 60  # a bound on the wait, not a performance claim: the servers stop gracefully


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) from /proc/<pid>/stat; None if there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), fields[19]


def _process_tree(roots: list[int]) -> dict[int, str]:
    """The processes ``roots`` and all their descendants, each with its start time (which tells it
    from a later process that reuses the pid)."""
    tree = {pid: stat[2] for pid in roots if (stat := _stat(pid))}
    while True:
        more = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in tree:
                stat = _stat(int(entry.name))
                if stat and stat[1] in tree:
                    more[int(entry.name)] = stat[2]
        if not more:
            return tree
        tree.update(more)


def _still_running(tree: dict[int, str]) -> dict[int, str]:
    """Those of ``tree`` still running (a zombie has exited: it only waits for init to reap it)."""
    out = {}
    for pid, start in tree.items():
        stat = _stat(pid)
        if stat and stat[2] == start and stat[0] != "Z":
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    return out


def _killed_fleet(admin_dsn: str, bundle_path: Path) -> tuple[list[str], dict[int, str]]:
    """Start a fleet of 2 env servers (2 verifier workers each) in a child process, SIGKILL that
    process mid-run, and wait for every process it started to be gone. Returns the databases it
    left behind and the processes that were running under it."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, admin_dsn, str(bundle_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    tree: dict[int, str] = {}
    try:
        line = child.stdout.readline()
        assert line.strip().startswith("["), child.stderr.read()
        servers = json.loads(line)
        tree = _process_tree(servers)
        assert set(servers) <= set(tree)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the fleet's own group: its env servers have their own sessions
        child.wait(30)
    deadline = time.monotonic() + GONE_WITHIN_S
    while _still_running(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    left_running = _still_running(tree)
    for pid in left_running:  # do not leave them to the next test either
        os.kill(pid, signal.SIGKILL)
    assert not left_running, f"still running {GONE_WITHIN_S} s after their fleet was killed: {left_running}"
    return [n for n in provision.list_instances(admin_dsn) if n.startswith("awm_i_killed")], tree


def test_a_killed_fleet_leaves_no_process_behind(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    """SIGKILL gives the fleet no chance to stop anything: its env servers (and, through them,
    their verifier workers) must still exit by themselves, not run on parented to init."""
    bundle_path = tmp_path / "notes.json"
    bundle_path.write_text(notes_bundle.model_dump_json())
    left, tree = _killed_fleet(admin_dsn, bundle_path)  # asserts that nothing of `tree` runs any more
    assert len(tree) >= 2 + 2 * 2, tree  # 2 env servers and at least their 2 verifier workers each
    for name in left:
        provision.drop_instance(admin_dsn, name)


async def test_killed_fleet_databases_are_reaped_by_the_next_fleet(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle_path = tmp_path / "notes.json"
    bundle_path.write_text(notes_bundle.model_dump_json())
    left, _ = _killed_fleet(admin_dsn, bundle_path)
    assert len(left) >= 2  # nothing cleaned them up (the two instances', and any made ahead)
    async with LocalFleet([notes_bundle], database=Database(admin_dsn), fleet_id="next", allow_ungated=True) as fleet:
        names = set(provision.list_instances(admin_dsn))
        assert not set(left) & names  # reaped when the next fleet started
        assert {h.db.dbname for h in fleet.instances} <= names
        assert reap_abandoned(admin_dsn) == []  # a live fleet's databases are never reaped
    assert not [n for n in provision.list_instances(admin_dsn) if n.startswith("awm_i_next")]


async def test_a_stopped_fleet_leaves_no_files_behind(admin_dsn: str, notes_bundle) -> None:
    """The catalog copies its env servers read and the provisioner's socket live in a directory of
    the fleet's own, removed at stop: `awm serve` run daily must not fill /tmp."""
    for binding in ("pinned", "late"):
        fleet = LocalFleet([notes_bundle], database=Database(admin_dsn), binding=binding, allow_ungated=True)
        async with fleet:
            workdir = fleet._workdir
            assert workdir is not None and (workdir / "catalog" / f"{notes_bundle.name}.json").is_file()
        assert not workdir.exists(), binding


def test_gc_command_keeps_foreign_and_live_databases(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle_path = tmp_path / "notes.json"
    bundle_path.write_text(notes_bundle.model_dump_json())
    template = provision.ensure_template(admin_dsn, notes_bundle)
    live = provision.create_instance(admin_dsn, template, "awm_i_gc_live", meta=owner_meta())
    pod = provision.create_instance(admin_dsn, template, "awm_i_gc_pod", meta={"pod": "p", "fleet": "f"})
    other_host = provision.create_instance(admin_dsn, template, "awm_i_gc_elsewhere",
                                           meta={**owner_meta(), "host": "another-machine", "pid": "1"})
    left, _ = _killed_fleet(admin_dsn, bundle_path)
    result = CliRunner().invoke(app, ["postgres", "gc", "--database-url", admin_dsn])
    assert result.exit_code == 0, result.output
    assert int(result.output.split()[1]) >= 2  # "dropped N ..." (older leftovers on this host count too)
    names = set(provision.list_instances(admin_dsn))
    assert not set(left) & names
    assert {live.dbname, pod.dbname, other_host.dbname} <= names
    for inst in (live, pod, other_host):
        provision.drop_instance(admin_dsn, inst.dbname)


async def test_a_fleet_without_the_envserver_extra_says_what_to_install(monkeypatch, notes_bundle) -> None:
    """`pip install awm-fleet[trainer]` alone: `awm train` on a local fleet must say what is missing,
    before it makes any database."""
    import importlib.util

    import pytest

    from awm.fleet import FleetError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    fleet = LocalFleet([notes_bundle], replicas=1, database=None)
    with pytest.raises(FleetError, match=r"pip install 'awm-fleet\[envserver\]'"):
        await fleet.start()
    assert fleet.database is None and not fleet.instances


def test_an_env_server_whose_parent_is_already_gone_exits_at_once(tmp_path: Path) -> None:
    """The race PR_SET_PDEATHSIG alone leaves open: the fleet died between fork and the prctl, so
    no signal will come. The env server sees that its parent is not the one named and exits
    before it touches a database or opens a port."""
    env = {"PATH": os.environ.get("PATH", ""), "AWM_PARENT_PID": "1",  # we are its parent, not pid 1
           "AWM_INSTANCE_DSN": "postgresql://nobody@127.0.0.1:1/none"}
    r = subprocess.run([sys.executable, "-m", "awm.envserver", "--bundle", str(tmp_path / "absent.json")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0 and "is gone; exiting" in r.stderr, r.stderr
    assert r.stdout == ""


def test_an_instance_whose_creator_died_before_its_database_comment_is_reaped(admin_dsn: str, notes_bundle) -> None:
    """A fleet killed between CREATE DATABASE and the database's comment (its provisioner makes
    databases ahead, in the background, at any moment) leaves a database without an owner record
    of its own; its role carries one from its creation on, so reap_abandoned still finds it. So
    does a role whose database was never made."""
    import psycopg
    from psycopg import sql

    dead = subprocess.Popen(["true"])
    dead.wait()
    meta = {**owner_meta(), "pid": str(dead.pid), "pid_start": "1"}  # a process that is gone
    template = provision.ensure_template(admin_dsn, notes_bundle)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name, make_database in (("awm_i_gcdied_half", True), ("awm_i_gcdied_role", False)):
            with conn.transaction():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
                conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(sql.Identifier(name),
                                                                       sql.Literal(json.dumps(meta))))
            if make_database:
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                              sql.Identifier(template.dbname)))
    assert "awm_i_gcdied_half" in provision.list_instances(admin_dsn)
    dropped = reap_abandoned(admin_dsn)
    assert {"awm_i_gcdied_half", "awm_i_gcdied_role"} <= set(dropped)
    with psycopg.connect(admin_dsn) as conn:
        left = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'awm_i_gcdied%'").fetchall()
    assert not left and "awm_i_gcdied_half" not in provision.list_instances(admin_dsn)
