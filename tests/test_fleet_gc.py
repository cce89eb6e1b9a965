"""A local fleet killed before it could clean up leaves instance databases behind; the next fleet
on the host (or ``awm postgres gc``) drops them, and never those of a fleet that is alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from awm.cli import app
from awm.fleet import Database, LocalFleet, owner_meta, reap_abandoned
from awm.postgres import provision

CHILD = textwrap.dedent("""
    import asyncio, sys
    from awm.bundle import EnvBundle
    from awm.fleet import Database, LocalFleet

    async def main():
        bundle = EnvBundle.model_validate_json(open(sys.argv[2]).read())
        fleet = LocalFleet([bundle], replicas=2, database=Database(sys.argv[1]), fleet_id="killed")
        await fleet.start()
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


def _killed_fleet(admin_dsn: str, bundle_path: Path) -> list[str]:
    """Start a fleet in a child process, then SIGKILL it (and its env servers) mid-run."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, admin_dsn, str(bundle_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read()
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    return [n for n in provision.list_instances(admin_dsn) if "_killed_" in n]


async def test_killed_fleet_databases_are_reaped_by_the_next_fleet(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle_path = tmp_path / "notes.json"
    bundle_path.write_text(notes_bundle.model_dump_json())
    left = _killed_fleet(admin_dsn, bundle_path)
    assert len(left) == 2  # nothing cleaned them up
    async with LocalFleet([notes_bundle], database=Database(admin_dsn), fleet_id="next") as fleet:
        names = set(provision.list_instances(admin_dsn))
        assert not set(left) & names  # reaped when the next fleet started
        assert {h.name for h in fleet.instances} <= names
        assert reap_abandoned(admin_dsn) == []  # a live fleet's databases are never reaped
    assert not [n for n in provision.list_instances(admin_dsn) if "_next_" in n]


def test_gc_command_keeps_foreign_and_live_databases(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle_path = tmp_path / "notes.json"
    bundle_path.write_text(notes_bundle.model_dump_json())
    template = provision.ensure_template(admin_dsn, notes_bundle)
    live = provision.create_instance(admin_dsn, template, "awm_i_gc_live", meta=owner_meta())
    pod = provision.create_instance(admin_dsn, template, "awm_i_gc_pod", meta={"pod": "p", "fleet": "f"})
    other_host = provision.create_instance(admin_dsn, template, "awm_i_gc_elsewhere",
                                           meta={**owner_meta(), "host": "another-machine", "pid": "1"})
    left = _killed_fleet(admin_dsn, bundle_path)
    result = CliRunner().invoke(app, ["postgres", "gc", "--database-url", admin_dsn])
    assert result.exit_code == 0, result.output
    assert int(result.output.split()[1]) >= 2  # "dropped N ..." (older leftovers on this host count too)
    names = set(provision.list_instances(admin_dsn))
    assert not set(left) & names
    assert {live.dbname, pod.dbname, other_host.dbname} <= names
    for inst in (live, pod, other_host):
        provision.drop_instance(admin_dsn, inst.dbname)


async def test_a_fleet_without_the_envserver_extra_says_what_to_install(monkeypatch, notes_bundle) -> None:
    """`pip install awm[trainer]` alone: `awm train` on a local fleet must say what is missing,
    before it makes any database."""
    import importlib.util

    import pytest

    from awm.fleet import FleetError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastmcp" else real(name, *a))
    fleet = LocalFleet([notes_bundle], replicas=1, database=None)
    with pytest.raises(FleetError, match=r"pip install 'awm\[envserver\]'"):
        await fleet.start()
    assert fleet.database is None and not fleet.instances
