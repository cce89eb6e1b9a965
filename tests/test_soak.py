"""The soak-and-chaos harness (bench/soak.py), short: about a minute of episodes on a local fleet
with every fault kind injected at least once - an env server killed and one hung (SIGSTOP), the
Postgres server killed and restarted and hung, a client vanishing mid-episode, half-open
connections - and nothing lost, dirty, leaked or seen across episodes; every fault recovered.

The run also injects leaks on purpose (``--inject-leak``: episodes that run on state a previous
run left behind) and the cross-episode check must find every one that completed: the check's
negative control. The full-length run and its figures: docs/benchmarks.md ("Soak and chaos").
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from awm.errorclass import ENVIRONMENT_FAULTS
from bench.soak import FAULT_KINDS

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 5.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """One soak for the module (its own Postgres cluster and fleet, in a process of its own)."""
    command = [sys.executable, "-m", "bench.soak", "--duration", "60", "--seed", "3", "--instances", "3",
               "--clients", "3", "--scripts", "8", "--deadline", str(DEADLINE_S), "--fault-every", "5",
               "--quiet-tail", "20", "--half-open-window", "20", "--interval", "20", "--inject-leak", "3",
               "--json", "--quiet"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip(), f"no report (exit {done.returncode}):\n{done.stderr[-4000:]}"
    out: dict[str, Any] = json.loads(done.stdout)
    out["_exit"], out["_stderr"] = done.returncode, done.stderr[-4000:]
    return out


def test_every_fault_kind_was_injected_and_recovered(report: dict[str, Any]) -> None:
    faults = report["faults"]
    assert set(faults["by_kind"]) == set(FAULT_KINDS), faults["by_kind"]
    assert faults["injected"] == faults["planned"]
    assert faults["unrecovered"] == [], faults["all"]
    for kind, entry in faults["by_kind"].items():
        assert entry["recovered"] == entry["injected"] >= 1, (kind, entry)
    assert report["instances_replaced"] >= faults["by_kind"]["env_kill"]["injected"]


def test_nothing_lost_dirty_or_seen_across_episodes(report: dict[str, Any]) -> None:
    episodes = report["episodes"]
    assert episodes["completed"] > 0 and episodes["lost"] == 0, report["lost"]
    assert episodes["claims_failed"] == 0, report["claim_failures"]
    assert episodes["abandoned_by_client_vanish"] >= 1
    assert report["resets"]["dirty"] == 0, report["resets"]["dirty_examples"]
    assert report["resets"]["checked"] >= episodes["completed"]
    cross = report["cross_episode"]
    assert cross["mismatches"] == 0, cross["examples"]
    assert cross["finals_checked"] == episodes["completed"]
    assert cross["scripts_left_out_nondeterministic"] == []


def test_the_cross_episode_check_finds_injected_leaks(report: dict[str, Any]) -> None:
    cross = report["cross_episode"]
    assert cross["leaks_injected"] >= 1
    assert cross["leaks_detected"] >= cross["leaks_injected_completed"] >= 1


def test_faults_cost_episodes_masked_never_a_hung_client(report: dict[str, Any]) -> None:
    """Every masked episode names what failed; none ran past the deadline's bound."""
    assert report["episodes"]["masked"] == sum(report["masked_by_reason"].values())
    for reason in report["masked_by_reason"]:
        stage, kind = reason.split(":", 1)
        assert stage in ("reset", "call", "diff", "verify"), reason
        assert kind == "infra" or kind in {c.value for c in ENVIRONMENT_FAULTS}, reason
    assert report["episode_s"]["over_bound"] == []
    assert report["episode_s"]["max"] < DEADLINE_S + 60


def test_nothing_leaked(report: dict[str, Any]) -> None:
    leaks = report["leaks"]
    assert leaks["claims_held"] == 0 and leaks["instances_not_returned"] == [], leaks
    assert leaks["databases_orphaned"] == [], leaks  # on the server, forgotten by the provisioner
    assert leaks["pg_backends_orphaned"] == [], leaks
    assert leaks["killed_server_processes_alive"] == 0, leaks


def test_no_database_is_left_held_by_nobody(report: dict[str, Any]) -> None:
    """Found by the soak: a release whose DROP met a Postgres fault was never tried again
    (awm/postgres/provisioner.py release_later now tries until the server is back;
    tests/test_late_binding.py::test_a_release_during_a_postgres_restart_is_dropped_once_it_is_back)."""
    assert report["leaks"]["databases_unheld"] == [], report["product_warnings"]


def test_half_open_connections_are_closed_by_the_server(report: dict[str, Any]) -> None:
    """Found by the soak: a connection whose request head arrived but whose body never did was
    held for ever (envserver/listener.py disarmed its deadline at the end of the head)."""
    assert report["leaks"]["half_open_connections_held"] == 0, report["half_open"]


def test_the_report_is_self_describing(report: dict[str, Any]) -> None:
    assert report["machine"]["cores"] >= 1 and report["postgres"]
    assert report["intervals"] and all("completed" in i for i in report["intervals"])
    assert report["ok"] is (report["failures"] == []) and report["_exit"] == (0 if report["ok"] else 1)


async def test_an_instance_whose_database_restarted_comes_back_to_the_pool(tmp_path: Path, notes_bundle: Any) -> None:
    """Found by the soak: after a Postgres restart, an instance that failed an episode (its
    connection gone: HTTP 503) answered /readyz "not ready" until a reset reconnected it, and the
    pool, which resets only the instances it hands out, never handed it out again. The pool's
    check resets an instance that is not ready only because its database connection is down."""
    from awm.client import ControlApiError
    from awm.episode.session import EpisodeSession
    from awm.episode.sources import PoolSource
    from awm.fleet import Database, LocalFleet
    from awm.postgres import provision
    from awm.postgres.server import EmbeddedPostgres

    pg = EmbeddedPostgres(tmp_path / "postgres")
    pg.start()
    try:
        provision.harden_cluster(pg.admin_dsn())
        async with LocalFleet([notes_bundle], database=Database(pg.admin_dsn()), allow_ungated=True) as fleet:
            source = PoolSource.from_fleet(fleet, ready_timeout_s=30, claim_timeout_s=60)
            try:
                lease = await source.claim("notes")
                assert lease.handle is not None
                session = EpisodeSession(lease.handle)
                await session.reset("add_note", verify=True)
                pg.restart()
                with pytest.raises(ControlApiError) as raised:  # the episode's database is gone
                    await session.control.diff()
                assert raised.value.status == 503
                assert (await session.control.readiness() or {}).get("db") is False
                await source.release(lease, healthy=False)
                lease = await asyncio.wait_for(source.claim("notes"), 60)  # back, reconnected
                reset = await EpisodeSession(lease.handle).reset("add_note", verify=True)
                assert reset["pristine"] is True
                await source.release(lease)
            finally:
                await source.close()
    finally:
        pg.stop()
