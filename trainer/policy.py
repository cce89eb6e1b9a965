"""Policies: what produces the agent's next message.

A policy takes the (windowed) chat history and the tool list and returns one assistant reply.
Three kinds exist:

* :class:`OpenAIPolicy` - any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, SGLang,
  OpenAI, Ollama). This is the production path: a vLLM server generates and the learner pushes
  new weights to it (docs/training.md).
* :class:`awm.trainer.local_policy.LocalPolicy` - a transformers model in this process (the CPU
  demo and tests); it returns token ids and log-probabilities for the learner.
* :class:`ReplayPolicy` - answers instantly with a task's reference solution (benchmarks, tests).

An endpoint that cannot be reached raises :class:`PolicyUnavailable` after bounded retries:
an outage of the policy is neither the agent's fault nor the environment's, and a run must stop
loudly instead of training on empty episodes.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from awm import settings
from awm.bundle import EnvBundle
from awm.episode import toolcalls
from awm.trainer import awm_format


class PolicyUnavailable(RuntimeError):
    """The policy endpoint cannot be reached, or keeps failing, or refuses the request."""


class ContextExceeded(RuntimeError):
    """The episode's prompt no longer fits the model's context window. That ends the episode (it
    is scored as it stands, like one out of turns), not the run: other episodes are shorter."""


# How OpenAI, vLLM, SGLang, TGI and llama.cpp word a prompt that is too long (a 400, 413 or 422).
# Narrow on purpose, and matched against the error's message rather than the whole body: a
# refusal for another reason ("tool name too long") must stop the run, not end episodes.
_CONTEXT_EXCEEDED = re.compile(
    r"context[_ ]length|context window|context size|maximum context|max_model_len|maximum model length|"
    r"prompt is too long|input is too long|too many (input )?tokens|must have less than \d+ tokens|"
    r"reduce the length of the (messages|prompt|input)|tokens?\b[^.\n]{0,80}(longer than|must be <=|exceeds?)",
    re.IGNORECASE)


_backoff = asyncio.sleep  # between attempts (a test records the waits instead)


def _retry_after(value: str | None) -> float:
    """Seconds a rate-limited server asks us to wait (``Retry-After: 12``), at most a minute; 0 if
    it says nothing usable (an HTTP date is rare from inference servers and ignored)."""
    try:
        return min(max(float(value), 0.0), 60.0) if value else 0.0
    except ValueError:
        return 0.0


def context_exceeded(body: str) -> bool:
    """Whether an error body says the prompt does not fit the model's context window. For a JSON
    body only its message, code and type count (``{"error": {...}}``, ``{"detail": ...}``)."""
    texts = [body]
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            texts = [str(error.get(key)) for key in ("message", "code", "type", "detail") if error.get(key)]
        else:
            texts = [str(error)]
    return any(_CONTEXT_EXCEEDED.search(text) for text in texts)


def with_thinking(extra_body: dict[str, Any], thinking: bool | None) -> dict[str, Any]:
    """``extra_body`` with Qwen3-style thinking switched on or off
    (``chat_template_kwargs.enable_thinking``); ``None`` leaves the template's default."""
    body = dict(extra_body)
    if thinking is not None:
        body["chat_template_kwargs"] = {**(body.get("chat_template_kwargs") or {}), "enable_thinking": thinking}
    return body


@dataclass
class PolicyReply:
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI format, when the server parsed calls
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Present when the policy runs in process (or the server returns them): what the learner needs.
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    version: int = 0  # the policy (weights) version that generated this reply


class Policy(Protocol):
    """The one method the agent loop needs; ``version`` tags every turn for staleness control."""

    version: int
    name: str

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PolicyReply: ...

    async def close(self) -> None: ...


@dataclass
class OpenAIPolicy:
    base_url: str
    model: str
    api_key: str = ""
    temperature: float = 1.0
    max_tokens: int = 2048
    timeout_s: float = 300.0
    retries: int = 6  # attempts on 429/5xx/unreachable: 0.5 s doubling to 30 s, or as Retry-After says
    extra_body: dict[str, Any] = field(default_factory=dict)
    version: int = 0

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        self.api_key = self.api_key or settings.AWM_POLICY_API_KEY  # else OPENAI_API_KEY
        # Every request carries the key: the chat calls and, for vLLM, its weight-sync endpoints
        # (/v1/load_lora_adapter and the like answer 401 without it on a server with a key).
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self._http = httpx.AsyncClient(timeout=self.timeout_s, headers=headers)

    @property
    def name(self) -> str:
        return self.model

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PolicyReply:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature,
                                "max_tokens": self.max_tokens, **self.extra_body}
        # extra_body null drops a field (e.g. max_tokens, which OpenAI's reasoning models refuse)
        body = {key: value for key, value in body.items() if value is not None}
        if tools:
            body["tools"] = tools
        data = await self._post(body)
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise PolicyUnavailable(f"{self.base_url} answered without a message: {str(data)[:300]}") from exc
        usage = data.get("usage") or {}
        prompt_ids, completion_ids, logprobs = _token_data(data, choice)
        return PolicyReply(message.get("content"), message.get("tool_calls") or None, choice.get("finish_reason"),
                           int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                           prompt_ids, completion_ids, logprobs, version=self.version)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + "/chat/completions"
        last = ""
        wait = 0.0
        for attempt in range(max(1, self.retries)):
            if attempt:
                await _backoff(wait or min(0.5 * 2 ** (attempt - 1), 30.0))
            wait = 0.0
            try:
                response = await self._http.post(url, content=json.dumps(body),
                                                 headers={"Content-Type": "application/json"})
            except httpx.HTTPError as exc:
                last = f"cannot reach {url}: {type(exc).__name__}: {exc}"
                continue
            if response.status_code == 429 or response.status_code >= 500:
                last = f"{url} answered HTTP {response.status_code}: {response.text[:300]}"
                wait = _retry_after(response.headers.get("retry-after"))
                continue
            if response.status_code in (400, 413, 422) and context_exceeded(response.text):
                raise ContextExceeded(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
            if response.status_code >= 400:
                raise PolicyUnavailable(f"{url} refused the request: HTTP {response.status_code}: {response.text[:500]}")
            try:
                return response.json()
            except json.JSONDecodeError:
                last = f"{url} answered with non-JSON: {response.text[:200]}"
        raise PolicyUnavailable(f"{last} (gave up after {max(1, self.retries)} attempts)")

    async def close(self) -> None:
        await self._http.aclose()


def _token_data(data: dict[str, Any], choice: dict[str, Any]) -> tuple[list[int] | None, list[int] | None,
                                                                      list[float] | None]:
    """Token ids and sampling log-probs, where the server returns them (vLLM: request
    ``"return_token_ids": true`` and ``"logprobs": true`` through ``extra_body``)."""
    prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    logprobs = [float(t["logprob"]) for t in content] if content else None
    if completion_ids is None or prompt_ids is None:
        return None, None, None
    if logprobs is not None and len(logprobs) != len(completion_ids):
        logprobs = None
    return list(prompt_ids), list(completion_ids), logprobs


@dataclass
class ReplayPolicy:
    """Replays each task's reference solution, one call per turn, then answers; in the agent's
    tool format (``tool_format``): native tool calls, text ``<tool_call>`` blocks, or the AWM
    meta-tools (``list_tools`` once, then a ``call_tool`` per step), so that a warm start's
    demonstrations are written exactly as the policy will have to write them.

    It answers instantly, so a benchmark built on it measures the environments and the rollout
    machinery, not a model. Tasks are recognised by their instruction (the first user message);
    progress is counted from the history it is shown, so use it without a history window.
    """

    bundles: list[EnvBundle]
    version: int = 0
    name: str = "replay"
    tool_format: str = "native"

    def __post_init__(self) -> None:
        if self.tool_format not in ("native", "text", "awm"):
            raise ValueError(f"tool_format must be native, text or awm, not {self.tool_format!r}")
        self._tasks = {t.instruction: t for b in self.bundles for t in b.tasks}

    def _calls_made(self, messages: list[dict[str, Any]]) -> int:
        mine = [m for m in messages if m.get("role") == "assistant"]
        if self.tool_format == "native":
            return sum(1 for m in mine if m.get("tool_calls"))
        made = sum(1 for m in mine if "<tool_call>" in (m.get("content") or ""))
        return made - 1 if self.tool_format == "awm" and made else made  # (the first was list_tools)

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PolicyReply:
        instruction = next((m["content"] for m in messages if m.get("role") == "user"), "")
        task = self._tasks.get(instruction)
        listed = any("<tool_call>" in (m.get("content") or "") for m in messages if m.get("role") == "assistant")
        if task is not None and task.solution and self.tool_format == "awm" and not listed:
            return PolicyReply(toolcalls.render_text_call(awm_format.LIST_TOOLS, {}), None, "stop", version=self.version)
        done = self._calls_made(messages)
        if task is None or done >= len(task.solution):
            answer = (task.final_answer if task else None) or "Done."
            return PolicyReply(answer, None, "stop", version=self.version)
        step = task.solution[done]
        if self.tool_format == "text":
            return PolicyReply(toolcalls.render_text_call(step.tool, step.arguments), None, "stop", version=self.version)
        if self.tool_format == "awm":
            return PolicyReply(awm_format.render_call(step.tool, step.arguments), None, "stop", version=self.version)
        call = {"id": f"replay_{done}", "type": "function",
                "function": {"name": step.tool, "arguments": json.dumps(step.arguments)}}
        return PolicyReply(None, [call], "tool_calls", version=self.version)

    async def close(self) -> None:
        return None
