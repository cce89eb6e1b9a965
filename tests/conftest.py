"""Shared fixtures: one real embedded PostgreSQL per test session, in a private AWM_HOME."""

from __future__ import annotations

import os
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from awm.authoring import compile_source_dir
from awm.bundle import EnvBundle
from awm.fleet import Database, InstanceHandle, LocalFleet
from awm.postgres import provision
from awm.postgres.server import EmbeddedPostgres

FIXTURES = Path(__file__).with_name("fixtures")


def require(condition: object, reason: str) -> None:
    """A test's prerequisite (a binary, a package, a kernel facility). Missing: skip with the
    reason on a developer's machine, but FAIL under ``CI=true`` (``.ci/run`` sets it), where every
    prerequisite is installed and a skip would hide that the test never ran."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing prerequisite is a failure)", pytrace=False)
    pytest.skip(reason)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Each failure's own message once more, short, at the very end: a CI log is read from its
    tail, and one failure's long report (a module fixture's, repeated for each of its tests) can
    push every other failure's out of it."""
    reports = terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
    if not reports:
        return
    terminalreporter.section("failures, in short")
    seen: set[str] = set()
    for report in reports:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        line = f"{os.path.relpath(crash.path, config.rootpath)}:{crash.lineno}" if crash is not None else ""
        if message in seen:
            terminalreporter.write_line(f"{report.nodeid} ({report.when}): the same as above")
            continue
        seen.add(message)
        terminalreporter.write_line(f"{report.nodeid} ({report.when}) {line}:\n{message[:2500]}")


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("awm-home") / "postgres")
    server.start()
    provision.harden_cluster(server.admin_dsn())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def admin_dsn(pg: EmbeddedPostgres) -> str:
    return pg.admin_dsn()


@pytest.fixture(scope="session")
def notes_bundle() -> EnvBundle:
    return compile_source_dir(FIXTURES / "notes")


@pytest.fixture(scope="module")
async def notes_fleet(admin_dsn: str, notes_bundle: EnvBundle) -> AsyncIterator[LocalFleet]:
    # A secret in our own environment must never reach an instance or a verifier.
    os.environ["OPENAI_API_KEY"] = "sk-test-must-not-leak"
    # The notes fixture holds hostile verifiers that can never pass their gates: served ungated.
    fleet = LocalFleet([notes_bundle], replicas=1, database=Database(admin_dsn), allow_ungated=True)
    await fleet.start()
    yield fleet
    await fleet.stop()
    os.environ.pop("OPENAI_API_KEY", None)


@pytest.fixture(scope="module")
def notes(notes_fleet: LocalFleet) -> InstanceHandle:
    return notes_fleet.instances[0]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory):
    """A real Kubernetes control plane (k8s/harness.py: etcd, apiserver, controller-manager,
    scheduler, kwok nodes). Skipped without the binaries (k8s/build.sh), except under CI=true."""
    from k8s import harness  # the repository's k8s/ (also run as a script: python3 k8s/harness.py)

    require(harness.binaries_present(),
            f"Kubernetes test binaries missing in {harness.default_bin_dir()}: run k8s/build.sh")
    cp = harness.ControlPlane()
    cp.start(tmp_path_factory.mktemp("k8s"))
    yield cp
    cp.stop()
