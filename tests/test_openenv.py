"""awm behind OpenEnv's environment API: OpenEnv's own server and an unmodified OpenEnv client
(``openenv-core``) running whole episodes against real instances."""

import asyncio
import importlib.util
import logging
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import uvicorn

from awm import catalog as catalog_mod
from awm.fleet import Database, LocalFleet

from tests.conftest import FIXTURES, require

require(importlib.util.find_spec("openenv") is not None, "openenv-core is not installed (the integrations extra)")
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from awm.episode.sources import PoolSource  # noqa: E402
from awm.integrations.openenv_server import build_app  # noqa: E402


async def serve(pool: PoolSource, max_steps: int = 30):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # log_config=None: uvicorn leaves logging alone, so its "uvicorn.error" records (an exception
    # in the app) reach the root logger, where caplog sees them (its own config stops them there)
    srv = uvicorn.Server(uvicorn.Config(build_app(pool, max_steps=max_steps), host="127.0.0.1", port=port,
                                        log_level="warning", log_config=None))
    task = asyncio.create_task(srv.serve())
    while not srv.started:
        await asyncio.sleep(0.02)
    return srv, task, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
async def server(admin_dsn):
    """Two notes instances (its hostile tools and verifiers served ungated) behind OpenEnv."""
    notes = catalog_mod.load(str(FIXTURES / "notes"))
    async with LocalFleet(notes, replicas=2, database=Database(admin_dsn), allow_ungated=True) as fleet:
        pool = PoolSource.from_fleet(fleet)
        srv, task, url = await serve(pool, max_steps=3)
        yield url, pool
        srv.should_exit = True
        await task
        await pool.close()


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


async def test_what_awm_knows_reaches_an_unmodified_client(server):
    """openenv-core's serializer drops an observation's ``metadata``: the reset's time, a call's
    awm error class (the agent's ``tool_error`` versus the environment's ``tool_crashed``), the
    masking and its reason, how the episode ended and the reward's parts are observation fields."""
    url, pool = server
    async with GenericEnvClient(base_url=url) as env:
        first = (await env.reset(task_id="add_note", env="notes")).observation
        assert first["reset_ms"] > 0 and first["ungated"] is False
        agents = await env.step({"type": "call_tool", "tool_name": "find_note", "arguments": {"title": "nope"}})
        assert agents.observation["error_kind"] == "tool_error"
        assert agents.observation["error"]["error_type"] == "execution_error"
        ours = await env.step({"type": "call_tool", "tool_name": "add_then_crash", "arguments": {"title": "x"}})
        assert ours.observation["error_kind"] == "tool_crashed"  # same error_type, another class
        assert ours.observation["error"]["error_type"] == "execution_error"
        end = await env.step({"answer": "Done."})
        assert end.done and end.reward is None
        assert end.observation["masked"] is True
        assert end.observation["mask_reason"] == "environment tool failure: tool_crashed"
        assert end.observation["ended_by"] == "answer"
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(task_id="add_note", env="notes")
        await env.step({"type": "call_tool", "tool_name": "add_note", "arguments": {"title": "groceries",
                                                                                    "body": "milk, eggs"}})
        end = await env.step({"answer": "Added."})
        assert end.reward == 1.0 and end.observation["masked"] is False
        assert end.observation["reward_components"]["outcome"] == 1.0
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(task_id="kills_itself", env="notes")
        end = await env.step({"answer": "Done."})  # its verifier dies: the environment's failure
        assert end.reward is None and end.observation["masked"]
        assert end.observation["mask_reason"].startswith("verifier error")
    assert pool.free() == 2


async def test_client_disconnects_are_quiet_and_give_the_instance_back(server, caplog):
    """A client that ends its session (or drops the socket mid-episode) is a normal end: no
    "Exception in ASGI application" (openenv-core closes the socket once more after the client
    did), and the episode's instance goes back to the pool."""
    url, pool = server
    with caplog.at_level(logging.ERROR):
        async with GenericEnvClient(base_url=url) as env:
            await env.reset(task_id="add_note", env="notes")
            await env.step({"answer": "Done."})
        dropped = GenericEnvClient(base_url=url)
        await dropped.connect()
        await dropped.reset(task_id="add_note", env="notes")
        assert pool.free() == 1
        await dropped._ws.close()  # mid-episode, without OpenEnv's close message
        for _ in range(200):
            if pool.free() == 2:
                break
            await asyncio.sleep(0.05)
    assert pool.free() == 2
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
    # (the check sees the server's log: a record of uvicorn's error logger reaches caplog)
    logging.getLogger("uvicorn.error").error("probe")
    assert [r for r in caplog.records if r.name == "uvicorn.error" and r.getMessage() == "probe"]


def openenv_example() -> str:
    """The OpenEnv client example of docs/integrations.md (the first python block of its
    OpenEnv section)."""
    text = (Path(__file__).parent.parent / "docs" / "integrations.md").read_text()
    section = text.split("## awm's own OpenEnv environment", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return block


async def test_the_documented_example_runs_as_written(admin_dsn):
    """docs/integrations.md's OpenEnv example, run by a plain interpreter against the starter
    crm served as `awm openenv serve` serves it (only its URL is this test's free port)."""
    bundles = catalog_mod.load("starter", ["crm"])
    async with LocalFleet(bundles, replicas=1, database=Database(admin_dsn)) as fleet:
        pool = PoolSource.from_fleet(fleet)
        srv, task, url = await serve(pool)
        try:
            code = openenv_example()
            assert "http://127.0.0.1:8000" in code
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code.replace("http://127.0.0.1:8000", url),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            srv.should_exit = True
            await task
            await pool.close()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[-1] == "1.0 True complete False answer", out.decode()
