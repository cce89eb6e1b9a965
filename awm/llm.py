"""Any OpenAI-compatible chat and embeddings endpoint, with the failure behaviour a long
synthesis run needs.

* Bounded concurrency (one semaphore per client), retries with exponential backoff on 429, 5xx
  and connection errors (honouring ``Retry-After``), then a clear :class:`LLMUnavailable`; never
  an empty completion that a caller could mistake for an answer.
* Structured outputs: the reply is parsed into a pydantic model. Malformed JSON is repaired when
  the repair is unambiguous (code fences, prose around one JSON object); otherwise the model is
  asked again with the parse or validation error, a bounded number of times, then the call fails
  with :class:`LLMBadOutput` carrying the last error.
* Token usage is counted per stage for the run summary.

Settings (flags override): ``AWM_LLM_BASE_URL`` (or ``OPENAI_BASE_URL``), ``AWM_LLM_API_KEY``
(or ``OPENAI_API_KEY``), ``AWM_LLM_MODEL``; embeddings: ``AWM_EMBED_BASE_URL``,
``AWM_EMBED_API_KEY``, ``AWM_EMBED_MODEL`` (defaulting to the chat endpoint's URL and key).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

M = TypeVar("M", bound=BaseModel)


class LLMUnavailable(RuntimeError):
    """The endpoint cannot be reached or keeps refusing: the run must stop, loudly."""


class LLMBadOutput(RuntimeError):
    """The model's reply never became valid output within the allowed attempts."""


@dataclass
class LLMSettings:
    base_url: str
    api_key: str
    model: str
    embed_base_url: str
    embed_api_key: str
    embed_model: str
    concurrency: int = 8
    timeout_s: float = 600.0
    retries: int = 5
    temperature: float = 0.7

    @classmethod
    def from_env(cls, base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                 concurrency: int | None = None) -> LLMSettings:
        env = os.environ
        url = base_url or env.get("AWM_LLM_BASE_URL") or env.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        key = api_key or env.get("AWM_LLM_API_KEY") or env.get("OPENAI_API_KEY") or ""
        return cls(
            base_url=url.rstrip("/"), api_key=key, model=model or env.get("AWM_LLM_MODEL") or "gpt-4.1-mini",
            embed_base_url=(env.get("AWM_EMBED_BASE_URL") or url).rstrip("/"),
            embed_api_key=env.get("AWM_EMBED_API_KEY") or key,
            embed_model=env.get("AWM_EMBED_MODEL") or "text-embedding-3-small",
            concurrency=concurrency or int(env.get("AWM_LLM_CONCURRENCY", "8")),
        )


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    retries: int = 0
    repairs: int = 0


@dataclass
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class LLMClient:
    settings: LLMSettings
    usage: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))

    def __post_init__(self) -> None:
        self._semaphore = asyncio.Semaphore(self.settings.concurrency)
        self._http = httpx.AsyncClient(timeout=self.settings.timeout_s)

    async def close(self) -> None:
        await self._http.aclose()

    # -- chat --------------------------------------------------------------------------------

    async def complete(self, stage: str, messages: list[dict[str, str]], max_tokens: int = 16000,
                       extra: dict[str, Any] | None = None) -> str:
        return (await self.chat(stage, messages, max_tokens, extra)).text

    async def chat(self, stage: str, messages: list[dict[str, str]], max_tokens: int = 16000,
                   extra: dict[str, Any] | None = None) -> Completion:
        """One chat completion; ``extra`` adds or overrides request fields (seed, temperature)."""
        body = {"model": self.settings.model, "messages": messages, "temperature": self.settings.temperature,
                "max_tokens": max_tokens, **(extra or {})}
        data = await self._post(stage, self.settings.base_url + "/chat/completions", self.settings.api_key, body)
        usage = data.get("usage") or {}
        done = Completion("", int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        record = self.usage[stage]
        record.calls += 1
        record.prompt_tokens += done.prompt_tokens
        record.completion_tokens += done.completion_tokens
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMBadOutput(f"{stage}: response has no message content: {str(data)[:300]}") from exc
        if not content:
            raise LLMBadOutput(f"{stage}: empty completion (finish_reason="
                               f"{data['choices'][0].get('finish_reason')!r})")
        done.text = str(content)
        return done

    async def structured(self, stage: str, system: str, user: str, model: type[M], attempts: int = 3,
                         max_tokens: int = 16000) -> M:
        """Ask for JSON matching ``model``; on a parse or validation error, show the model its
        error and ask again (``attempts`` in all)."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        last_error = ""
        for attempt in range(attempts):
            text = await self.complete(stage, messages, max_tokens)
            try:
                return model.model_validate(extract_json(text))
            except (ValueError, ValidationError) as exc:
                last_error = str(exc)[:2000]
                self.usage[stage].repairs += 1
                messages += [{"role": "assistant", "content": text[:20000]},
                             {"role": "user", "content": "Your reply could not be used: " + last_error +
                              "\nReply again with only the corrected JSON object."}]
        raise LLMBadOutput(f"{stage}: no valid {model.__name__} after {attempts} attempts: {last_error}")

    # -- embeddings ----------------------------------------------------------------------------

    async def embed(self, texts: list[str], stage: str = "embed") -> list[list[float]]:
        body = {"model": self.settings.embed_model, "input": texts}
        data = await self._post(stage, self.settings.embed_base_url + "/embeddings", self.settings.embed_api_key, body)
        usage = data.get("usage") or {}
        self.usage[stage].calls += 1
        self.usage[stage].prompt_tokens += int(usage.get("prompt_tokens") or 0)
        items = sorted(data["data"], key=lambda d: d.get("index", 0))
        return [list(map(float, item["embedding"])) for item in items]

    # -- transport -----------------------------------------------------------------------------

    async def _post(self, stage: str, url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}

        async def once() -> dict[str, Any]:
            async with self._semaphore:
                try:
                    response = await self._http.post(url, json=body, headers=headers)
                except httpx.TransportError as exc:
                    raise _Retryable(f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc
            if response.status_code == 429 or response.status_code >= 500:
                delay = _retry_after(response)
                if delay:
                    await asyncio.sleep(min(delay, 60))
                raise _Retryable(f"{url} answered HTTP {response.status_code}: {response.text[:300]}")
            if response.status_code >= 400:
                raise LLMUnavailable(f"{url} refused the request: HTTP {response.status_code}: {response.text[:500]}")
            try:
                return response.json()
            except json.JSONDecodeError as exc:
                raise _Retryable(f"{url} answered with non-JSON: {response.text[:200]}") from exc

        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.settings.retries), reraise=True,
                wait=wait_exponential(multiplier=0.5, max=30),
                retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
                before_sleep=lambda _state: self._count_retry(stage),
            ):
                with attempt:
                    return await once()
        except _Retryable as exc:
            raise LLMUnavailable(f"{exc} (gave up after {self.settings.retries} attempts)") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _count_retry(self, stage: str) -> None:
        self.usage[stage].retries += 1


class _Retryable(Exception):
    pass


def _retry_after(response: httpx.Response) -> float:
    try:
        return float(response.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0


_FENCE = re.compile(r"```(?:json|python)?\s*\n(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON value in a model's reply: as is, inside a code fence, or the one outermost
    object in surrounding prose. Raises ``ValueError`` when none of these parse."""
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start:end + 1])
    errors = []
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError as exc:
            errors.append(str(exc))
    raise ValueError(f"reply is not valid JSON ({errors[0] if errors else 'empty'})")
