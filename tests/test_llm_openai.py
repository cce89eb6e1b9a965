"""awm/llm.py and the judge against a local server that enforces the request rules of OpenAI's
chat completions API the way OpenAI does: HTTP 400 with OpenAI's own error bodies for

* reasoning families (o1, o3, o4-mini, gpt-5 ...): ``max_tokens`` (use ``max_completion_tokens``),
  a temperature or top_p other than the default 1, and (o1-mini) ``reasoning_effort``;
* the other models: ``reasoning_effort``, and ``max_completion_tokens`` with ``max_tokens`` both;
* ``response_format`` of type ``json_schema`` for a model that has no structured outputs
  (``gpt-3.5-turbo``), and a malformed schema.

The error texts are OpenAI's (as its API answers them); the server is a fake of OpenAI, the
client under test is the real one over real HTTP.
"""

from __future__ import annotations

import asyncio

import json
import re
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from awm.judge import JUDGEMENT_SCHEMA, Judge, JudgeSettings, Step
from awm.llm import (LLMClient, LLMRefused, LLMSettings, is_reasoning_model, parse_flag, request_body)
from tests.llm_server import LocalEndpoint

REASONING = re.compile(r"^(o[1-9](-.*)?|gpt-5(?!-chat)([.-].*)?)$")  # OpenAI's reasoning families
NO_STRUCTURED_OUTPUTS = {"gpt-3.5-turbo", "gpt-4-turbo"}


def _error(message: str, param: str | None, code: str | None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": code}}, status_code=400)


# Completion-token limits of older models, as OpenAI enforces them.
COMPLETION_CAPS = {"gpt-3.5-turbo": 4096}


def openai_rules(body: dict[str, Any], deployment_model: str | None = None) -> JSONResponse | None:
    """The 400 OpenAI answers for this request, or None when it would accept it.
    ``deployment_model``: the real model behind a deployment name (Azure-style aliases)."""
    model = deployment_model or body["model"]
    reasoning = bool(REASONING.match(model))
    if reasoning:
        if "max_tokens" in body:
            return _error("Unsupported parameter: 'max_tokens' is not supported with this model. "
                          "Use 'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")
        for name in ("temperature", "top_p"):
            if name in body and body[name] != 1:
                return _error(f"Unsupported value: '{name}' does not support {body[name]} with this model. "
                              "Only the default (1) value is supported.", name, "unsupported_value")
        for name in ("presence_penalty", "frequency_penalty", "logprobs"):
            if name in body:
                return _error(f"Unsupported parameter: '{name}' is not supported with this model.", name,
                              "unsupported_parameter")
        if model.startswith("o1-mini") and "reasoning_effort" in body:
            return _error("Unsupported parameter: 'reasoning_effort' is not supported with this model.",
                          "reasoning_effort", "unsupported_parameter")
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in ("minimal", "low", "medium", "high"):
            return _error(f"Invalid value: '{effort}'. Supported values are: 'minimal', 'low', 'medium', and "
                          "'high'.", "reasoning_effort", "invalid_value")
    else:
        if "reasoning_effort" in body:
            return _error("Unrecognized request argument supplied: reasoning_effort", None, None)
        cap = COMPLETION_CAPS.get(model)
        if cap and body.get("max_tokens", 0) > cap:
            return _error(f"max_tokens is too large: {body['max_tokens']}. This model supports at most {cap} "
                          f"completion tokens, whereas you provided {body['max_tokens']}.", "max_tokens", "invalid_value")
        if "max_tokens" in body and "max_completion_tokens" in body:
            return _error("max_tokens and max_completion_tokens cannot both be set", "max_tokens", None)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if model in NO_STRUCTURED_OUTPUTS:
            return _error("Invalid parameter: 'response_format' of type 'json_schema' is not supported with "
                          "this model. Learn more about supported models at the Structured Outputs guide: "
                          "https://platform.openai.com/docs/guides/structured-outputs", "response_format", None)
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return _error("Invalid schema for response_format 'judgement': schema must be a JSON Schema of "
                          "'type: \"object\"', got 'type: \"None\"'.", "response_format", None)
    return None


class OpenAIRules(LocalEndpoint):
    """A local endpoint answering like OpenAI: refuses what OpenAI refuses, otherwise answers
    ``reply`` (JSON text). Every request body and the status it got are recorded."""

    def __init__(self, reply: str, deployments: dict[str, str] | None = None) -> None:
        self.reply = reply
        self.deployments = deployments or {}
        self.requests: list[tuple[int, dict[str, Any]]] = []
        super().__init__([Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        refused = openai_rules(body, self.deployments.get(body["model"]))
        self.requests.append((refused.status_code if refused else 200, body))
        if refused is not None:
            return refused
        return JSONResponse({"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": self.reply}}],
                             "usage": {"prompt_tokens": 10, "completion_tokens": 5}})


VERDICT = json.dumps({"reasoning": "the note exists", "classification": "complete"})


@pytest.fixture(scope="module")
def openai():
    with OpenAIRules(VERDICT, deployments={"my-judge": "gpt-5-mini"}) as server:
        yield server


def client(server: OpenAIRules, model: str, **kwargs: Any) -> LLMClient:
    return LLMClient(LLMSettings(base_url=server.base_url, api_key="k", model=model, embed_base_url=server.base_url,
                                 embed_api_key="k", embed_model="", retries=1, **kwargs))


@pytest.mark.parametrize("model, reasoning", [
    ("o1", True), ("o1-mini", True), ("o3-mini", True), ("o3-pro", True), ("o4-mini", True), ("gpt-5", True),
    ("gpt-5-mini", True), ("gpt-5.1", True), ("gpt-5-nano-2025-08-07", True), ("openai/o3", True),
    ("gpt-5-chat-latest", False), ("gpt-4.1-mini", False), ("gpt-4o", False), ("omni-moderation", False),
    ("Qwen/Qwen3-8B", False), ("smollm2", False), ("policy", False), ("o", False)])
def test_the_model_family_rule(model, reasoning):
    assert is_reasoning_model(model) is reasoning


def test_request_shapes():
    messages = [{"role": "user", "content": "hi"}]
    plain = request_body("gpt-4.1-mini", messages, 100, 0.7, {"seed": 1, "reasoning_effort": "low"})
    assert plain == {"model": "gpt-4.1-mini", "messages": messages, "temperature": 0.7, "max_tokens": 100, "seed": 1}
    shaped = request_body("o3", messages, 100, 0.7, {"seed": 1, "temperature": 0.0, "top_p": 0.9}, None, "high")
    assert shaped == {"model": "o3", "messages": messages, "max_completion_tokens": 100, "seed": 1,
                      "reasoning_effort": "high"}
    # the explicit setting wins over the name, both ways
    assert "max_completion_tokens" in request_body("my-judge", messages, 100, 0.7, reasoning=True)
    assert "max_tokens" in request_body("o3", messages, 100, 0.7, reasoning=False)
    with pytest.raises(ValueError, match="reasoning_effort must be one of"):
        LLMSettings("u", "k", "o3", "u", "k", "", reasoning_effort="extreme")
    assert parse_flag(" Yes", "X") is True and parse_flag("0", "X") is False
    with pytest.raises(ValueError, match="AWM_LLM_REASONING must be"):
        parse_flag("maybe", "AWM_LLM_REASONING")


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWM_LLM_MODEL", "my-judge")
    monkeypatch.setenv("AWM_LLM_REASONING", "true")
    monkeypatch.setenv("AWM_LLM_REASONING_EFFORT", "low")
    s = LLMSettings.from_env(base_url="http://x/v1")
    assert (s.is_reasoning, s.reasoning_effort) == (True, "low")
    monkeypatch.setenv("AWM_LLM_REASONING", "off")
    assert LLMSettings.from_env(base_url="http://x/v1", model="o3").is_reasoning is False
    monkeypatch.delenv("AWM_LLM_REASONING")
    assert LLMSettings.from_env(base_url="http://x/v1", model="o3").is_reasoning is True


async def test_the_server_refuses_what_openai_refuses(openai):
    """The fake is strict: the request shape of a plain model is refused for a reasoning one, with
    OpenAI's text, and the client says so (no retry: a 400 cannot get better)."""
    shapes = [({"max_tokens": 64}, "'max_tokens' is not supported with this model. Use 'max_completion_tokens'"),
              ({"max_completion_tokens": 64, "temperature": 0.0},
               "'temperature' does not support 0.0 with this model. Only the default (1) value is supported."),
              ({"max_completion_tokens": 64, "top_p": 0.5}, "'top_p' does not support 0.5")]
    for fields, text in shapes:
        body = {"model": "o3", "messages": [{"role": "user", "content": "hi"}], **fields}
        llm = client(openai, "o3")
        try:
            with pytest.raises(LLMRefused, match=re.escape(text)) as refused:
                await llm._post("t", openai.base_url + "/chat/completions", "k", body)
        finally:
            await llm.close()
        assert refused.value.status == 400
    llm = client(openai, "gpt-4o", reasoning_effort="low")
    try:  # reasoning_effort is never sent to a plain model, even when configured
        assert (await llm.chat("t", [{"role": "user", "content": "hi"}], 64)).text == VERDICT
    finally:
        await llm.close()
    assert openai.requests[-1] == (200, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                                         "temperature": 0.7, "max_tokens": 64})


@pytest.mark.parametrize("model, settings", [
    ("o3", {}), ("o4-mini", {"reasoning_effort": "low"}), ("gpt-5", {"reasoning_effort": "minimal"}),
    ("o1-mini", {}), ("my-judge", {"reasoning": True, "reasoning_effort": "high"}), ("gpt-4.1-mini", {})])
async def test_each_family_is_accepted_with_its_own_shape(openai, model, settings):
    llm = client(openai, model, **settings)
    try:
        done = await llm.chat("t", [{"role": "user", "content": "hi"}], 256, extra={"seed": 3, "temperature": 0.0})
    finally:
        await llm.close()
    status, body = openai.requests[-1]
    assert (status, done.text) == (200, VERDICT)
    assert body.get("reasoning_effort") == settings.get("reasoning_effort")
    assert ("max_completion_tokens" in body) is (model != "gpt-4.1-mini")


async def test_a_deployment_name_needs_the_explicit_setting(openai):
    """``my-judge`` is a gpt-5-mini behind an alias: by its name it gets the plain shape, which
    the server refuses; with ``reasoning: true`` it is accepted."""
    llm = client(openai, "my-judge")
    try:
        with pytest.raises(LLMRefused, match="max_completion_tokens"):
            await llm.chat("t", [{"role": "user", "content": "hi"}], 64)
    finally:
        await llm.close()


async def test_structured_output_is_sent_and_a_refusal_falls_back_once(openai):
    schema = {"type": "json_schema", "json_schema": {"name": "judgement", "schema": JUDGEMENT_SCHEMA, "strict": True}}
    llm = client(openai, "gpt-4.1-mini")
    try:
        await llm.chat("t", [{"role": "user", "content": "hi"}], 64, response_format=schema)
        assert openai.requests[-1][0] == 200 and openai.requests[-1][1]["response_format"] == schema
    finally:
        await llm.close()
    old = client(openai, "gpt-3.5-turbo")
    try:
        n = len(openai.requests)
        for _ in range(2):
            assert (await old.chat("t", [{"role": "user", "content": "hi"}], 64, response_format=schema)).text == VERDICT
        statuses = [(status, "response_format" in body) for status, body in openai.requests[n:]]
        assert statuses == [(400, True), (200, False), (200, False)]  # refused once, then not offered again
        assert old.usage["t"].format_fallbacks == 1
    finally:
        await old.close()
    other = client(openai, "o1-mini", reasoning_effort="low")  # a refusal of something else: not retried
    try:
        n = len(openai.requests)
        with pytest.raises(LLMRefused, match="'reasoning_effort' is not supported"):
            await other.chat("t", [{"role": "user", "content": "hi"}], 64, response_format=schema)
        assert len(openai.requests) == n + 1 and not other.response_format_refused
    finally:
        await other.close()


async def test_synthesis_asks_for_each_stage_s_schema(openai):
    # awm gen's stages (LLMClient.structured) send their pydantic model's schema, so a small model
    # served by vLLM is guided to parseable JSON; AWM_LLM_STRUCTURED_OUTPUT=0 sends none.
    from typing import Literal

    from pydantic import BaseModel

    class Judgement(BaseModel):
        reasoning: str
        classification: Literal["complete", "incomplete", "agent_error", "server_error"]

    for structured in (True, False):
        llm = client(openai, "gpt-4.1-mini", structured_output=structured)
        try:
            reply = await llm.structured("task", "system", "user", Judgement)
            assert reply.classification in ("complete", "incomplete", "agent_error", "server_error")
            sent = openai.requests[-1][1].get("response_format")
            if structured:
                assert sent == {"type": "json_schema", "json_schema": {
                    "name": "task", "schema": Judgement.model_json_schema(), "strict": False}}
            else:
                assert sent is None
        finally:
            await llm.close()


async def test_an_output_budget_beyond_the_model_s_is_fitted_once(openai):
    # awm gen's stages ask for 16,000 tokens; a model that allows fewer refuses the request and
    # names its cap: sent again at the cap, and later requests go out at it without a refusal.
    llm = client(openai, "gpt-3.5-turbo")
    try:
        n = len(openai.requests)
        for _ in range(2):
            assert (await llm.chat("t", [{"role": "user", "content": "hi"}], 16000)).text == VERDICT
        sent = [(status, body["max_tokens"]) for status, body in openai.requests[n:]]
        assert sent == [(400, 16000), (200, 4096), (200, 4096)] and llm.output_cap == 4096
        assert (await llm.chat("t", [{"role": "user", "content": "hi"}], 100)).text == VERDICT
        assert openai.requests[-1][1]["max_tokens"] == 100  # a smaller budget is left as it is
    finally:
        await llm.close()
    llm = client(openai, "gpt-4.1-mini", max_output_tokens=2048)  # a user's cap (AWM_LLM_MAX_TOKENS)
    try:
        await llm.chat("t", [{"role": "user", "content": "hi"}], 16000)
        assert openai.requests[-1][0] == 200 and openai.requests[-1][1]["max_tokens"] == 2048
    finally:
        await llm.close()
    llm = client(openai, "gpt-3.5-turbo")  # concurrent requests are all refused before the cap is known
    try:
        replies = await asyncio.gather(*(llm.chat("t", [{"role": "user", "content": "hi"}], 16000) for _ in range(4)))
        assert [r.text for r in replies] == [VERDICT] * 4 and llm.output_cap == 4096
    finally:
        await llm.close()
    from awm.llm import LLMRefused, output_cap

    vllm = '{"error":{"message":"max_tokens=16000 cannot be greater than max_model_len=8192. Please request fewer"}}'
    assert output_cap(LLMRefused("", 400, vllm)) == 8192
    assert output_cap(LLMRefused("", 400, "max_completion_tokens is too large: 90000. This model supports at most "
                                          "32768 completion tokens, whereas you provided 90000.")) == 32768
    assert output_cap(LLMRefused("", 400, "max_tokens=8888 cannot be greater than "
                                          "max_model_len=max_total_tokens=3072.")) == 3072
    # another field's bound in the same error is not the output cap
    assert output_cap(LLMRefused("", 400, '{"error": "max_tokens: must be <= 4096; top_logprobs must be at most 20"}')) is None
    assert output_cap(LLMRefused("", 422, '[{"loc": ["max_tokens"]}, {"loc": ["n"], "msg": "at most 1"}]')) is None
    assert output_cap(LLMRefused("", 400, '{"error": "tool name too long: at most 64"}')) is None
    assert output_cap(LLMRefused("", 500, vllm)) is None


def test_structured_output_setting_from_the_environment(monkeypatch):
    from awm.llm import LLMSettings

    assert LLMSettings.from_env("http://x/v1", "k", "m").structured_output is True
    monkeypatch.setenv("AWM_LLM_STRUCTURED_OUTPUT", "0")
    assert LLMSettings.from_env("http://x/v1", "k", "m").structured_output is False
    monkeypatch.setenv("AWM_LLM_STRUCTURED_OUTPUT", "maybe")
    with pytest.raises(ValueError, match="AWM_LLM_STRUCTURED_OUTPUT"):
        LLMSettings.from_env("http://x/v1", "k", "m")
    monkeypatch.delenv("AWM_LLM_STRUCTURED_OUTPUT")
    assert LLMSettings.from_env("http://x/v1", "k", "m").max_output_tokens is None
    monkeypatch.setenv("AWM_LLM_MAX_TOKENS", "2048")
    assert LLMSettings.from_env("http://x/v1", "k", "m").max_output_tokens == 2048
    for bad in ("0", "-5", "lots"):
        monkeypatch.setenv("AWM_LLM_MAX_TOKENS", bad)
        with pytest.raises(ValueError, match="AWM_LLM_MAX_TOKENS must be a positive integer"):
            LLMSettings.from_env("http://x/v1", "k", "m")


@pytest.mark.parametrize("model, settings, shape", [
    ("gpt-5", {}, {"max_completion_tokens": 8192}),
    ("my-judge", {"reasoning": True, "reasoning_effort": "low"}, {"max_completion_tokens": 8192,
                                                                   "reasoning_effort": "low"}),
    ("gpt-4.1-mini", {}, {"max_tokens": 1024, "temperature": 0.7}),  # votes sample at vote_temperature
    ("gpt-3.5-turbo", {}, {"max_tokens": 1024, "temperature": 0.7})])
async def test_the_judge_against_each_family(openai, model, settings, shape):
    """The judge's verdict comes back from every family; a reasoning model is asked without a
    temperature (even with votes), with its larger budget; the schema goes where accepted."""
    judge = Judge(JudgeSettings(base_url=openai.base_url, model=model, votes=2, **settings), api_key="k")
    n = len(openai.requests)
    try:
        result = await judge.judge("Add a note.", {"notes": 1}, [Step(tool="add_note", result="ok")], "done")
    finally:
        await judge.close()
    assert (result.classification, result.votes) == ("complete", ["complete", "complete"])
    accepted = [body for status, body in openai.requests[n:] if status == 200]
    assert len(accepted) == 2
    for body in accepted:
        assert {k: body.get(k) for k in shape} == shape
        if "max_completion_tokens" in shape:
            assert "temperature" not in body and "max_tokens" not in body
        assert ("response_format" in body) is (model != "gpt-3.5-turbo")


def test_judge_settings_round_trip_through_the_environment():
    s = JudgeSettings(base_url="http://j/v1", model="my-judge", reasoning=True, reasoning_effort="low",
                      structured_output=False)
    assert JudgeSettings.from_env(s.to_env()) == s
    plain = JudgeSettings(base_url="http://j/v1", model="m")
    assert JudgeSettings.from_env(plain.to_env()) == plain
