"""Postgres restarted mid-episode: the episode is reported void, the instance reconnects by
itself, and the next reset is proven pristine. Uses a cluster of its own to restart freely."""

import pytest

from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from awm.postgres import provision
from awm.postgres.server import EmbeddedPostgres


@pytest.fixture(scope="module")
def own_pg(tmp_path_factory):
    server = EmbeddedPostgres(tmp_path_factory.mktemp("restart-home") / "postgres")
    server.start()
    provision.harden_cluster(server.admin_dsn())
    yield server
    server.stop()


async def test_postgres_restart_mid_episode(own_pg, notes_bundle):
    async with LocalFleet([notes_bundle], database=Database(own_pg.admin_dsn()), allow_ungated=True) as fleet:
        handle = fleet.instances[0]
        control = ControlClient(handle.control_url)
        async with McpSession(handle.mcp_url) as mcp:
            await control.reset("add_note")
            assert not (await mcp.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})).is_error

            own_pg.restart()  # every connection is dropped; the uncommitted episode is gone

            out = await mcp.call_tool("list_notes", {})
            assert out.is_error and out.error_kind == "unavailable"
            verdict = await control.verify(None)
            assert verdict["verdict"] == "error" and verdict["error_kind"] == "infra"
            assert "episode lost" in verdict["reason"]

            reset = await control.reset("add_note")  # reconnects and proves the state
            assert reset["pristine"] is True
            assert (await control.diff())["tables"] == {}
            assert not (await mcp.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})).is_error
            assert (await control.verify(None))["verdict"] == "complete"
        await control.close()


async def test_restart_between_episodes_is_invisible(own_pg, notes_bundle):
    async with LocalFleet([notes_bundle], database=Database(own_pg.admin_dsn()), allow_ungated=True) as fleet:
        handle = fleet.instances[0]
        control = ControlClient(handle.control_url)
        await control.reset("count_notes")
        own_pg.restart()
        reset = await control.reset("count_notes")
        assert reset["pristine"] is True
        async with McpSession(handle.mcp_url) as mcp:
            assert not (await mcp.call_tool("list_notes", {})).is_error
        assert (await control.verify("You have 3 notes."))["verdict"] == "complete"
        await control.close()
