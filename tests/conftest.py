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
    fleet = LocalFleet([notes_bundle], replicas=1, database=Database(admin_dsn))
    await fleet.start()
    yield fleet
    await fleet.stop()
    os.environ.pop("OPENAI_API_KEY", None)


@pytest.fixture(scope="module")
def notes(notes_fleet: LocalFleet) -> InstanceHandle:
    return notes_fleet.instances[0]
