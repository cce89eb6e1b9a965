"""The fleet's database servers (awm_operator/databases.py): shards from the Secret's keys,
placing a new pod, probing; and the pod-side provisioning command against the real PostgreSQL."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import psycopg

from awm.postgres import provision
from awm_operator import databases
from awm_operator.databases import Shard, choose_shard, shard_keys


def test_database_shards_are_the_secrets_dsn_keys() -> None:
    """Key `dsn` is the shard `default` (one server, as before shards); `dsn-<name>` are more;
    other keys (the chart's postgres-password) and names that are no label value are not shards."""
    keys = ["dsn", "dsn-1", "dsn-east-2", "postgres-password", "dsn-", "dsn-UPPER", "dsn-a_b", "dsnx"]
    assert shard_keys(keys) == {"1": "dsn-1", "default": "dsn", "east-2": "dsn-east-2"}


def test_a_new_pod_goes_to_the_up_shard_with_the_most_free_connection_slots() -> None:
    a = Shard("a", "dsn-a", "host=a", up=True, max_connections=100, connections=10)
    b = Shard("b", "dsn-b", "host=b", up=True, max_connections=100, connections=40)
    assert choose_shard([a, b], {}).name == "a"
    # pods placed on a and not Ready yet count as the slots they will take (2 each)
    assert choose_shard([a, b], {"a": 16}).name == "b"
    assert choose_shard([a, b], {"a": 15}).name == "a"
    # a shard that is down, lost or never probed takes none; ties go to the first by name
    b.up = False
    assert choose_shard([a, b], {"a": 44}).name == "a" and choose_shard([a, b], {"a": 45}) is None  # 100-10-90 < 2
    c = Shard("c", "dsn-c", "host=c", up=None)
    assert choose_shard([c], {}) is None and choose_shard([], {}) is None
    d = Shard("d", "dsn-d", "host=d", up=True, max_connections=100, connections=10)
    b.up = True
    b.connections = 10
    assert choose_shard([d, b, a], {}).name == "a"


def test_a_shard_is_lost_after_failing_its_probes_for_long_enough() -> None:
    s = Shard("a", "dsn-a", "host=a")
    assert s.observe((100, 3), now=0.0, lost_after=30) and s.up and s.connections == 3
    assert s.observe(OSError("connection refused"), now=1.0, lost_after=30)  # up -> down
    assert not s.up and not s.lost and "connection refused" in s.error
    assert not s.observe(OSError("refused"), now=20.0, lost_after=30)        # still down
    assert s.observe(OSError("refused"), now=31.0, lost_after=30) and s.lost  # 30 s after the first failure
    assert s.observe((100, 0), now=40.0, lost_after=30)                        # back: up, not lost
    assert s.up and not s.lost and s.down_since is None and s.error == ""


# --------------------------------------------------------------------------- pod-side provisioning


def test_provision_instance_command(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle = tmp_path / "env.json"
    bundle.write_text(notes_bundle.model_dump_json())
    dsn_file = tmp_path / "run" / "instance.dsn"
    pod_name = "unit-notes-abcde"
    env = {**os.environ, "AWM_ADMIN_DSN": admin_dsn, "AWM_FLEET": "unit", "POD_NAMESPACE": "ns1"}
    command = [sys.executable, "-m", "awm.postgres.provision", "--bundle", str(bundle),
               "--name", pod_name, "--dsn-file", str(dsn_file)]  # exactly what the init container runs
    r = subprocess.run(command, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(dsn_file.stat().st_mode) == 0o600
    dbname = provision.pod_instance_name(pod_name)
    dsn = dsn_file.read_text()
    assert admin_dsn not in dsn and f"dbname={dbname}" in dsn.replace("'", "")
    with psycopg.connect(dsn) as conn:  # the instance role reaches its own database
        assert conn.execute("SELECT current_database()").fetchone()[0] == dbname
    assert databases.fleet_databases(admin_dsn, "ns1", "unit") == {dbname: pod_name}
    # Run twice (an init container restarted): a fresh database again, no error.
    r = subprocess.run(command, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert databases.drop_orphans(admin_dsn, "ns1", "unit", live_pods={pod_name}) == []
    assert databases.drop_orphans(admin_dsn, "ns1", "unit", live_pods=set()) == [dbname]
    assert dbname not in provision.list_instances(admin_dsn)


def test_envserver_reads_its_dsn_from_a_file(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle = tmp_path / "env.json"
    bundle.write_text(notes_bundle.model_dump_json())
    template = provision.ensure_template(admin_dsn, notes_bundle)
    inst = provision.create_instance(admin_dsn, template, provision.pod_instance_name("dsnfile-notes-x1"))
    dsn_file = tmp_path / "instance.dsn"
    dsn_file.write_text(inst.dsn + "\n")
    dsn_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "AWM_INSTANCE_DSN"}
    env["AWM_INSTANCE_DSN_FILE"] = str(dsn_file)
    proc = subprocess.Popen([sys.executable, "-m", "awm.envserver", "--bundle", str(bundle), "--mcp-port", "0",
                             "--control-port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        import httpx

        assert httpx.get(ready["control_url"] + "/readyz", timeout=10).status_code == 200
        assert httpx.post(ready["control_url"] + "/reset", json={"task_id": None}, timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)
        provision.drop_instance(admin_dsn, inst.dbname)
