"""A real instruction-tuned model in the loops: SmolLM2-135M-Instruct (``tests/real_model.py``
converts and caches it) served by a REAL vLLM (``tests/vllm_env.py``), one server for this
module, with the tool template that the conversion writes beside the model (ChatML plus hermes
tool markup: the model's own template drops ``tools``, so the native format would never show it
its tools; docs/benchmarks.md has the numbers of both).

Budget: the server's start-up (~2-3 min on 2 busy cores, most of it vLLM's compilation
warm-up) and a handful of requests (~10-30 s). What is checked, with the model's own answers:

* the judge asks for its verdict by JSON schema and gets a parsed verdict (the same model asked
  without the schema never produced parseable JSON in the measurement);
* an episode of the eval loop on the lamps fixture, guided to call tools (``tool_choice:
  required``), reaches the environment: its calls are executed or refused by the env server's
  own argument validation, not dropped as unparseable by the agent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import real_model, vllm_env
from tests.conftest import require

# The server's start-up is part of the first test's setup: beyond the suite's 300 s on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

LAMPS = Path(__file__).parent / "fixtures" / "lamps"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory):
    from awm.trainer.vllm_server import VllmServer

    error = ""
    if os.environ.get("CI") == "true" and not (vllm_env.installed() and real_model.installed()):
        try:  # .ci/run builds both first; this is the fallback
            real_model.install()
        except Exception as exc:  # noqa: BLE001 - reported by require below
            error = str(exc)[-2000:]
    require(vllm_env.installed(), f"vLLM is not installed in {vllm_env.env_dir()} (python tests/vllm_env.py) {error}")
    require(real_model.installed(), f"the real model is not built in {real_model.cache_dir()} "
                                    f"(python tests/real_model.py) {error}")
    model = real_model.model_dir()
    server = VllmServer(str(vllm_env.python()), str(model), tmp_path_factory.mktemp("smollm2"),
                        served_name=real_model.SERVED_NAME, max_model_len=4096, lora_rank=0,
                        # eager: no compilation warm-up at start-up (most of it), for a few requests
                        extra_args=["--chat-template", str(model / "tool_chat_template.jinja"), "--enforce-eager"],
                        startup_timeout_s=900)
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


async def test_the_judge_on_the_real_model_returns_a_parsed_verdict(smollm2):
    from awm.judge import CLASSES, Judge, JudgeSettings, Step

    judge = Judge(JudgeSettings(base_url=smollm2.base_url, model=real_model.SERVED_NAME, timeout_s=300,
                                deadline_s=600), api_key="")
    try:
        result = await judge.judge("Switch on the green lamp.", {"lamps_on": ["green"]},
                                   [Step(tool="switch_on", arguments={"color": "green"}, result='{"on": "green"}')],
                                   "Done.")
    finally:
        await judge.close()
    # Parsed is what is asserted; right is not (a 135M model judges poorly: docs/benchmarks.md).
    assert result.classification in CLASSES, result.reasoning
    assert result.votes == [result.classification] and result.completion_tokens > 0
    assert result.model == real_model.SERVED_NAME


async def test_an_eval_episode_of_the_real_model_reaches_the_env(smollm2, admin_dsn):
    from awm.authoring import compile_source_dir
    from awm.fleet import Database, LocalFleet
    from awm.trainer.agent import AgentConfig, EnvHandle, run_episode
    from awm.trainer.policy import OpenAIPolicy

    bundle = compile_source_dir(LAMPS)
    tools = {t.name for t in bundle.tools}
    fleet = LocalFleet([bundle], replicas=1, database=Database(admin_dsn), allow_ungated=True)
    await fleet.start()
    policy = OpenAIPolicy(smollm2.base_url, real_model.SERVED_NAME, temperature=0.0, max_tokens=128,
                          timeout_s=300, extra_body={"tool_choice": "required"})
    try:
        handle = fleet.instances[0]
        env = await EnvHandle.connect(handle.mcp_url, handle.control_url, scenario=bundle.scenario.description)
        try:
            traj = await run_episode(policy, env, "green_on", AgentConfig(max_turns=2))
        finally:
            await env.close()
    finally:
        await policy.close()
        await fleet.stop()
    results = [r for t in traj.turns for r in t.results]
    reached = [r for r in results if r.get("name") in tools and r.get("error_kind") != "malformed"]
    assert reached, [t.tool_calls for t in traj.turns]
    assert traj.verdict is not None and traj.verdict["verdict"] in ("complete", "incomplete"), traj.verdict
    assert all(t.prompt_tokens for t in traj.turns)  # the server's own count: the real tokenizer's
