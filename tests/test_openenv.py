"""awm behind OpenEnv's environment API: OpenEnv's own server and an unmodified OpenEnv client
(``openenv-core``) running whole episodes against real instances."""

import asyncio
import importlib.util
import socket

import pytest
import uvicorn

from awm.fleet import Database, LocalFleet

from tests.conftest import require

require(importlib.util.find_spec("openenv") is not None, "openenv-core is not installed (the integrations extra)")
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from awm.episode.sources import PoolSource  # noqa: E402
from awm.integrations.openenv_server import build_app  # noqa: E402


@pytest.fixture(scope="module")
async def server(admin_dsn, notes_bundle):
    async with LocalFleet([notes_bundle], replicas=2, database=Database(admin_dsn)) as fleet:
        pool = PoolSource.from_fleet(fleet)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = uvicorn.Server(uvicorn.Config(build_app(pool, max_steps=3), host="127.0.0.1", port=port, log_level="warning"))
        task = asyncio.create_task(srv.serve())
        while not srv.started:
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}", pool
        srv.should_exit = True
        await task


async def test_a_whole_episode_through_an_openenv_client(server):
    url, pool = server
    async with GenericEnvClient(base_url=url) as env:
        first = await env.reset(task_id="add_note", env="notes")
        obs = first.observation
        assert obs["instruction"].startswith("Add a note") and not first.done
        assert "add_note" in {t["name"] for t in obs["tools"]}
        listed = await env.step({"type": "list_tools"})
        assert "archive_note" in {t["name"] for t in listed.observation["tools"]}
        called = await env.step({"type": "call_tool", "tool_name": "add_note",
                                 "arguments": {"title": "groceries", "body": "milk, eggs"}})
        assert called.observation["error"] is None and called.observation["result"] == {"id": 5, "title": "groceries"}
        state = await env.state()
        assert (state["step_count"], state["task_id"], state["env"]) == (1, "add_note", "notes")
        end = await env.step({"answer": "Added the note."})
        assert end.done and end.reward == 1.0
        assert end.observation["verdict"]["verdict"] == "complete"
    assert pool.free() == 2  # the instance went back


async def test_tool_errors_carry_their_class_and_unanswered_episodes_end(server):
    url, _ = server
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(task_id="add_note", env="notes")
        bad = await env.step({"type": "call_tool", "tool_name": "add_note", "arguments": {"title": 5}})
        assert bad.observation["error"]["error_type"] == "invalid_args"
        assert "is not of type 'string'" in bad.observation["error"]["message"]
        await env.step({"type": "call_tool", "tool_name": "list_notes", "arguments": {}})
        last = await env.step({"type": "call_tool", "tool_name": "list_notes", "arguments": {}})
        assert last.done and last.reward == 0.0  # max_steps=3 reached without an answer
        assert last.observation["verdict"]["verdict"] == "incomplete"


async def test_concurrent_sessions_each_hold_an_instance(server):
    url, pool = server

    async def episode(title: str) -> float:
        async with GenericEnvClient(base_url=url) as env:
            await env.reset(task_id="add_note", env="notes")
            await env.step({"type": "call_tool", "tool_name": "add_note",
                            "arguments": {"title": "groceries", "body": "milk, eggs" if title == "ok" else title}})
            return (await env.step({"answer": "done"})).reward

    assert sorted(await asyncio.gather(episode("ok"), episode("wrong body"))) == [0.0, 1.0]
    assert pool.free() == 2
