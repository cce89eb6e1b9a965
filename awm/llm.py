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

* OpenAI's reasoning model families (o1, o3, o4-mini, gpt-5 ...) refuse ``max_tokens`` (they
  take ``max_completion_tokens``, which also bounds their hidden reasoning) and any temperature or
  top_p but the default; they take ``reasoning_effort``. Which request shape a model gets is
  decided by :func:`is_reasoning_model` (its name) unless the settings say so explicitly
  (``reasoning``: a deployment named ``my-judge`` may be a gpt-5), see :func:`request_body`.
* Structured outputs by schema (``response_format``: ``json_schema``) where the endpoint supports
  it (OpenAI, vLLM, SGLang); an endpoint that refuses the field is asked again without it, once,
  and not offered it again (the reply is then parsed and repaired as any other).

Settings (flags override): ``AWM_LLM_BASE_URL`` (or ``OPENAI_BASE_URL``), ``AWM_LLM_API_KEY``
(or ``OPENAI_API_KEY``), ``AWM_LLM_MODEL``, ``AWM_LLM_REASONING`` (``1``/``0``: force the reasoning
request shape on or off; unset: by the model's name), ``AWM_LLM_REASONING_EFFORT`` (``minimal``,
``low``, ``medium``, ``high``; sent to reasoning models only), ``AWM_LLM_STRUCTURED_OUTPUT``
(``0``: never send ``response_format``; default on), ``AWM_LLM_MAX_TOKENS`` (a cap on every
request's output tokens); embeddings: ``AWM_EMBED_BASE_URL``,
``AWM_EMBED_API_KEY``, ``AWM_EMBED_MODEL`` (defaulting to the chat endpoint's URL and key).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from awm import settings
from awm.settings import parse_flag  # noqa: F401 - where callers have always found it

M = TypeVar("M", bound=BaseModel)


class LLMUnavailable(RuntimeError):
    """The endpoint cannot be reached or keeps refusing: the run must stop, loudly."""


class LLMRefused(LLMUnavailable):
    """The endpoint answered 4xx: the request itself is wrong for it (retrying cannot help)."""

    def __init__(self, message: str, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class LLMBadOutput(RuntimeError):
    """The model's reply never became valid output within the allowed attempts."""


# OpenAI's reasoning families: o1, o1-mini, o3, o3-mini, o3-pro, o4-mini, gpt-5, gpt-5-mini, gpt-5.1 ...
# (not gpt-5-chat-*, the non-reasoning chat model). A provider prefix ("openai/o3") is ignored.
_REASONING = re.compile(r"^(o[1-9](-.*)?|gpt-5(?!-chat)([.-].*)?)$")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# Sampling fields a reasoning model refuses unless at their default (OpenAI answers 400).
_SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
             "logit_bias")


def is_reasoning_model(model: str) -> bool:
    """Whether ``model`` names one of OpenAI's reasoning families, by its name alone. Names that
    do not say (Azure deployments, proxies' aliases) need the explicit setting."""
    return bool(_REASONING.match(model.rsplit("/", 1)[-1].strip().lower()))


def request_body(model: str, messages: list[dict[str, Any]], max_tokens: int, temperature: float,
                 extra: dict[str, Any] | None = None, reasoning: bool | None = None,
                 reasoning_effort: str | None = None) -> dict[str, Any]:
    """One chat request in the shape the model accepts. ``reasoning``: None decides by
    :func:`is_reasoning_model`. A reasoning model gets ``max_completion_tokens`` (and any
    ``max_tokens`` in ``extra`` renamed), no temperature, top_p or other sampling fields (``extra``'s
    are dropped too: the model samples at its defaults), and ``reasoning_effort`` when given; any
    other model gets ``max_tokens`` and ``temperature``, never ``reasoning_effort``."""
    body: dict[str, Any] = {"model": model, "messages": messages, "temperature": temperature,
                            "max_tokens": max_tokens, **(extra or {})}
    if not (is_reasoning_model(model) if reasoning is None else reasoning):
        body.pop("reasoning_effort", None)
        return body
    body["max_completion_tokens"] = body.pop("max_tokens")
    for name in _SAMPLING:
        body.pop(name, None)
    if reasoning_effort:
        body["reasoning_effort"] = reasoning_effort
    return body


def json_schema_format(name: str, schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """An OpenAI ``response_format`` asking for JSON matching ``schema`` (vLLM and SGLang take the
    same field and enforce it by guided decoding)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


# How a server says the output budget exceeds what the model can produce at all, in the two
# wordings known (anchored: an error listing several fields must not lend us another's bound):
# vLLM/SGLang "max_tokens=16000 cannot be greater than max_model_len=8192" (or
# "max_model_len=max_total_tokens=3072"), OpenAI "max_tokens is too large: 16000. This model
# supports at most 4096 completion tokens". The number is the cap.
_OUTPUT_CAP = (
    re.compile(r"max_(?:completion_)?tokens\s*=\s*\d+ cannot be greater than max_model_len"
               r"(?:\s*=\s*max_total_tokens)?\s*=\s*(\d+)"),
    re.compile(r"max_(?:completion_)?tokens is too large: \d+\. This model supports at most (\d+) completion tokens"),
)
_BUDGET_KEYS = ("max_tokens", "max_completion_tokens")


def output_cap(exc: LLMRefused) -> int | None:
    """The most output tokens the endpoint allows, when ``exc`` refused a larger budget."""
    if exc.status not in (400, 422):
        return None
    for pattern in _OUTPUT_CAP:
        match = pattern.search(exc.body)
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    return None


def _refuses_response_format(exc: LLMRefused) -> bool:
    text = exc.body.lower()
    return exc.status in (400, 422) and any(w in text for w in ("response_format", "json_schema",
                                                                "structured output", "guided"))


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
    reasoning: bool | None = None  # None: by the model's name (is_reasoning_model)
    reasoning_effort: str | None = None
    # Ask for each stage's JSON by its schema (response_format json_schema): vLLM and SGLang then
    # guide decoding to it, OpenAI follows it best-effort; an endpoint that refuses it is asked
    # without it from then on. Off: AWM_LLM_STRUCTURED_OUTPUT=0.
    structured_output: bool = True
    # At most this many output tokens per request, whatever a stage asks for (up to 16,000 for
    # code): a small model guided into a JSON string that never ends otherwise writes until its
    # context is full. None: as asked (and as the endpoint allows). AWM_LLM_MAX_TOKENS.
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, "
                             f"not {self.reasoning_effort!r}")

    @property
    def is_reasoning(self) -> bool:
        return is_reasoning_model(self.model) if self.reasoning is None else self.reasoning

    @classmethod
    def from_env(cls, base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                 concurrency: int | None = None, reasoning: bool | None = None,
                 reasoning_effort: str | None = None) -> LLMSettings:
        url = base_url or settings.AWM_LLM_BASE_URL
        key = api_key or settings.AWM_LLM_API_KEY
        if reasoning is None:
            reasoning = settings.AWM_LLM_REASONING
        return cls(
            base_url=url.rstrip("/"), api_key=key, model=model or settings.AWM_LLM_MODEL,
            embed_base_url=(settings.AWM_EMBED_BASE_URL or url).rstrip("/"),
            embed_api_key=settings.AWM_EMBED_API_KEY or key,
            embed_model=settings.AWM_EMBED_MODEL,
            concurrency=concurrency or settings.AWM_LLM_CONCURRENCY,
            reasoning=reasoning, reasoning_effort=reasoning_effort or settings.AWM_LLM_REASONING_EFFORT,
            structured_output=settings.AWM_LLM_STRUCTURED_OUTPUT,
            max_output_tokens=settings.AWM_LLM_MAX_TOKENS,
        )


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    retries: int = 0
    repairs: int = 0
    format_fallbacks: int = 0  # requests re-sent without a refused response_format


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
        self.response_format_refused = False  # the endpoint refused response_format once: not offered again
        # the most output tokens a request asks for: the setting, or less once the endpoint names its cap
        self.output_cap: int | None = self.settings.max_output_tokens

    async def close(self) -> None:
        await self._http.aclose()

    # -- chat --------------------------------------------------------------------------------

    async def complete(self, stage: str, messages: list[dict[str, str]], max_tokens: int = 16000,
                       extra: dict[str, Any] | None = None) -> str:
        return (await self.chat(stage, messages, max_tokens, extra)).text

    async def chat(self, stage: str, messages: list[dict[str, str]], max_tokens: int = 16000,
                   extra: dict[str, Any] | None = None, response_format: dict[str, Any] | None = None
                   ) -> Completion:
        """One chat completion; ``extra`` adds or overrides request fields (seed, temperature),
        shaped by :func:`request_body` for the model's family. ``response_format`` is sent unless
        this endpoint has refused it; a refusal of it is retried once without it."""
        s = self.settings
        body = request_body(s.model, messages, max_tokens, s.temperature, extra, s.reasoning, s.reasoning_effort)
        url = s.base_url + "/chat/completions"
        if response_format is not None and not self.response_format_refused:
            try:
                data = await self._post_fitted(stage, url, {**body, "response_format": response_format})
            except LLMRefused as exc:
                if not _refuses_response_format(exc):
                    raise
                self.response_format_refused = True
                self.usage[stage].format_fallbacks += 1
                data = await self._post_fitted(stage, url, body)
        else:
            data = await self._post_fitted(stage, url, body)
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
        """Ask for JSON matching ``model`` (by its schema, where the endpoint takes one: a small
        model guided to the schema writes parseable JSON where it would write prose); on a parse
        or validation error, show the model its error and ask again (``attempts`` in all)."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        last_error = ""
        schema = json_schema_format(stage, model.model_json_schema(), strict=False) \
            if self.settings.structured_output else None
        for attempt in range(attempts):
            text = (await self.chat(stage, messages, max_tokens, response_format=schema)).text
            try:
                return model.model_validate(extract_json(text))
            except (ValueError, ValidationError) as exc:
                last_error = str(exc)[:2000]
                self.usage[stage].repairs += 1
                messages += [{"role": "assistant", "content": text[:20000]},
                             {"role": "user", "content": "Your reply could not be used: " + last_error +
                              "\nReply again with only the corrected JSON object."}]
        raise LLMBadOutput(f"{stage}: no valid {model.__name__} after {attempts} attempts: {last_error}")

    async def _post_fitted(self, stage: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """The request with its output budget within what the endpoint allows: the stages ask
        for up to 16,000 tokens, which a model of a smaller context (SmolLM2: 8,192) refuses
        outright. A refusal that names the cap is sent again once at the cap, and the cap is
        kept for this client's later requests; the server still ends a reply at its context."""
        def fitted(body: dict[str, Any]) -> dict[str, Any]:
            cap = self.output_cap
            return {k: (min(v, cap) if k in _BUDGET_KEYS and cap and isinstance(v, int) else v)
                    for k, v in body.items()}

        sent = fitted(body)
        try:
            return await self._post(stage, url, self.settings.api_key, sent)
        except LLMRefused as exc:
            cap = output_cap(exc)
            budget = max((v for k, v in sent.items() if k in _BUDGET_KEYS and isinstance(v, int)), default=0)
            if cap is None or budget <= cap:  # refused for something else, or already at the cap
                raise
            # concurrent requests may all be refused at once: the smallest cap named wins
            self.output_cap = cap if self.output_cap is None else min(cap, self.output_cap)
            return await self._post(stage, url, self.settings.api_key, fitted(body))

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
                raise LLMRefused(f"{url} refused the request: HTTP {response.status_code}: {response.text[:500]}",
                                 response.status_code, response.text[:4000])
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
