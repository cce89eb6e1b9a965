"""The code-augmented LLM judge: verifier evidence + the episode's tool calls -> a verdict class.

A ``judge`` verifier (:class:`awm.bundle.Verifier`) only gathers evidence from the initial and
final databases; the judge model then classifies the episode as

* ``complete``     - the task was done (the database evidence shows it);
* ``incomplete``   - it was not;
* ``agent_error``  - the agent misused the tools (wrong arguments, invented ids, gave up);
* ``server_error`` - the environment failed the agent (tool crashes, 5xx): masked, never charged;

and ``judge_error`` when the judge itself fails (unreachable, malformed output after retries):
masked too. This follows the reference system's "sql" mode (its recommended one) and improves on
it where it hurts rewards:

* deterministic by default (temperature 0 and a fixed seed; the reference samples at 1.0);
* optional k-vote majority (``votes``), reporting the agreement;
* a bounded trajectory: long episodes are cut to a token budget *deliberately* - the first
  steps and the last ones are kept whole, the middle is replaced by a note that says how many
  steps (and which tools) were left out, and every cut is reported with the verdict;
* a cache keyed by (model, prompt) - i.e. by task, evidence and trajectory - so re-verifying a
  saved run or a repeated state costs nothing;
* bounded time: per-request timeout, a few retries, one overall deadline;
* structured output: the verdict is asked for by JSON schema (``response_format``), which vLLM,
  SGLang and OpenAI enforce while decoding, so even a small model's verdict parses; an endpoint
  that refuses the field is asked without it (the reply is then parsed and repaired as before);
* OpenAI's reasoning models (o-series, gpt-5; by name or ``reasoning: true``) are asked with
  ``max_completion_tokens`` (``reasoning_max_output_tokens``: their hidden reasoning counts
  against it), no temperature (they sample at their default, so votes differ by sampling, not by
  ``vote_temperature``) and ``reasoning_effort`` when set.

The endpoint is any OpenAI-compatible server (vLLM, SGLang, OpenAI): ``AWM_JUDGE_BASE_URL``,
``AWM_JUDGE_MODEL`` and ``AWM_JUDGE_API_KEY`` (the key only ever lives in the process that calls
the judge - the env server - never in the confined workers that run verifier code).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from pydantic import BaseModel, Field, ValidationError

from awm import settings as awm_settings

# awm.llm (and httpx under it) is imported where a judge is built: every env server imports this
# module, most serve no judge, and that import is a tenth of a pod's start.

_env = awm_settings.var  # the AWM_JUDGE_* variables' declarations: JudgeSettings' defaults are theirs

CLASSES = ("complete", "incomplete", "agent_error", "server_error")
# A tie between votes goes to the class that pays the agent least and masks nothing it should not.
_TIE_ORDER = ("incomplete", "agent_error", "server_error", "complete")
CHARS_PER_TOKEN = 4  # the judge model's tokenizer is unknown here: a conservative estimate


class JudgeSettings(BaseModel):
    """Where the judge is and how it is asked. One model for the env server's flags, the fleet and
    campaign specs, and the trainer's config."""

    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://vllm:8000/v1.")
    model: str
    api_key_env: str = Field(default=_env.AWM_JUDGE_API_KEY_ENV.default,
                             description="Name of the environment variable holding the API key.")
    temperature: float = Field(default=_env.AWM_JUDGE_TEMPERATURE.default, ge=0.0, le=2.0)
    seed: int = _env.AWM_JUDGE_SEED.default
    votes: int = Field(default=_env.AWM_JUDGE_VOTES.default, ge=1, le=15,
                       description="k-vote majority; >1 samples at vote_temperature.")
    vote_temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    timeout_s: float = Field(default=_env.AWM_JUDGE_TIMEOUT_S.default, gt=0, description="Per request.")
    retries: int = Field(default=3, ge=1, le=10)
    deadline_s: float = Field(default=_env.AWM_JUDGE_DEADLINE_S.default, gt=0,
                              description="The whole judgement, retries and votes included.")
    max_trajectory_tokens: int = Field(default=_env.AWM_JUDGE_MAX_TRAJECTORY_TOKENS.default, ge=200)
    max_evidence_tokens: int = Field(default=3000, ge=100)
    max_output_tokens: int = Field(default=1024, ge=64)
    cache_size: int = Field(default=4096, ge=0)
    structured_output: bool = Field(default=_env.AWM_JUDGE_STRUCTURED_OUTPUT.default, description=(
        "Ask for the verdict by JSON schema (response_format); refused by the endpoint: asked without it."))
    reasoning: bool | None = Field(default=_env.AWM_JUDGE_REASONING.default, description=(
        "OpenAI reasoning-model request shape (max_completion_tokens, no temperature); None: by the model's name."))
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = \
        _env.AWM_JUDGE_REASONING_EFFORT.default
    reasoning_max_output_tokens: int = Field(default=8192, ge=256, description="The completion budget "
                                             "of a reasoning model, its hidden reasoning included.")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JudgeSettings | None:
        """``AWM_JUDGE_BASE_URL`` and ``AWM_JUDGE_MODEL`` (both needed), ``AWM_JUDGE_VOTES``,
        ``AWM_JUDGE_TIMEOUT_S``, ``AWM_JUDGE_MAX_TRAJECTORY_TOKENS``...; ``None`` when unset. The
        text as set is validated by this model (its fields' types and bounds)."""
        base_url, model = _env.AWM_JUDGE_BASE_URL.raw(env), _env.AWM_JUDGE_MODEL.raw(env)
        if not base_url or not model:
            return None
        data: dict[str, Any] = {"base_url": base_url, "model": model}
        for key, declared in _FROM_ENV:
            if declared.raw(env):
                data[key] = declared.raw(env)
        return cls.model_validate(data)

    def to_env(self) -> dict[str, str]:
        """The inverse of :meth:`from_env` (the key itself is passed separately, by name)."""
        env = {_env.AWM_JUDGE_BASE_URL.name: self.base_url, _env.AWM_JUDGE_MODEL.name: self.model}
        for field, declared in _FROM_ENV:
            value = getattr(self, field)
            if value is not None:
                env[declared.name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return env


# The fields besides the endpoint and model that the environment may set (declared in awm/settings.py).
_FROM_ENV = (("votes", _env.AWM_JUDGE_VOTES), ("timeout_s", _env.AWM_JUDGE_TIMEOUT_S),
             ("seed", _env.AWM_JUDGE_SEED), ("temperature", _env.AWM_JUDGE_TEMPERATURE),
             ("max_trajectory_tokens", _env.AWM_JUDGE_MAX_TRAJECTORY_TOKENS),
             ("api_key_env", _env.AWM_JUDGE_API_KEY_ENV), ("deadline_s", _env.AWM_JUDGE_DEADLINE_S),
             ("structured_output", _env.AWM_JUDGE_STRUCTURED_OUTPUT), ("reasoning", _env.AWM_JUDGE_REASONING),
             ("reasoning_effort", _env.AWM_JUDGE_REASONING_EFFORT))


class Step(BaseModel):
    """One tool call of the episode, as the env server logged it."""

    tool: str
    arguments: Any = None
    ok: bool = True
    error_kind: str | None = None
    result: str = ""


class Judgement(BaseModel):
    """What the judge model must answer (JSON)."""

    reasoning: str = ""
    classification: Literal["complete", "incomplete", "agent_error", "server_error"]


# The verdict's JSON schema as a response_format. Written out rather than generated from
# Judgement: OpenAI's strict mode wants every property required and no additional ones; the
# reasoning comes first so that the class is decided after it (and is bounded in length, so a
# small model that rambles still reaches the class within max_output_tokens).
JUDGEMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"reasoning": {"type": "string", "maxLength": 1200},
                   "classification": {"type": "string", "enum": list(CLASSES)}},
    "required": ["reasoning", "classification"],
    "additionalProperties": False,
}


@dataclass
class JudgeResult:
    classification: str  # one of CLASSES, or judge_error
    reasoning: str
    votes: list[str] = field(default_factory=list)
    agreement: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    ms: float = 0.0
    truncation: dict[str, Any] = field(default_factory=dict)
    model: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"classification": self.classification, "reasoning": self.reasoning[:4000], "votes": self.votes,
                "agreement": round(self.agreement, 3), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached": self.cached, "ms": round(self.ms, 1),
                "truncation": self.truncation, "model": self.model}


SYSTEM_PROMPT = """You judge whether an AI agent completed a task in a simulated application backed by a database.
You are given the user's task, the success and failure criteria, the evidence that verification code gathered by
comparing the database before and after the episode, and the agent's tool calls with their results.

Classify the episode as exactly one of:
- "complete": the task was accomplished; the database evidence (and, for questions, the final answer) shows it.
- "server_error": the environment failed the agent (tool crashes, internal errors, timeouts) so it could not finish.
- "agent_error": the agent misused the tools (invalid arguments, invented identifiers, wrong tool) and did not finish.
- "incomplete": anything else that is not complete (partial work, wrong changes, no attempt, a wrong answer).
Priority when several apply: complete > server_error > agent_error > incomplete.
Trust the database evidence over the agent's claims; do not rely on the verification output blindly either.
Reply with one JSON object only: {"reasoning": "<two or three sentences>", "classification": "<class>"}."""


def clip(text: str, tokens: int) -> tuple[str, bool]:
    limit = tokens * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text, False
    return text[:limit] + f" [... {len(text) - limit} characters cut]", True


def render_trajectory(steps: list[Step], final_answer: str | None, budget_tokens: int
                      ) -> tuple[str, dict[str, Any]]:
    """The tool calls as text within ``budget_tokens``: each result clipped to a share of the
    budget; if still too long, the first two and as many last steps as fit are kept whole and the
    middle is summarised by name. Returns the text and a report of what was cut."""
    per_result = max(budget_tokens // max(len(steps), 1), 200)
    lines, clipped = [], 0
    for i, step in enumerate(steps):
        result, was_clipped = clip(step.result, min(per_result, budget_tokens // 2))
        clipped += was_clipped
        status = "ok" if step.ok else f"error ({step.error_kind or 'error'})"
        lines.append(f"[{i + 1}] {step.tool}({json.dumps(step.arguments, default=str, sort_keys=True)}) -> {status}: "
                     f"{result}")
    limit = budget_tokens * CHARS_PER_TOKEN
    omitted: list[int] = []
    if sum(len(x) + 1 for x in lines) > limit and len(lines) > 3:
        head, tail = lines[:2], []
        used = sum(len(x) + 1 for x in head) + 200
        for index in range(len(lines) - 1, 1, -1):
            if used + len(lines[index]) + 1 > limit:
                break
            tail.insert(0, lines[index])
            used += len(lines[index]) + 1
        first_tail = len(lines) - len(tail)
        omitted = list(range(3, first_tail + 1))  # 1-based step numbers
        names = Counter(steps[i - 1].tool for i in omitted)
        note = (f"[... steps {omitted[0]}-{omitted[-1]} omitted ({len(omitted)} calls: "
                + ", ".join(f"{n}x{t}" for t, n in names.most_common()) + ") ...]") if omitted else ""
        lines = head + ([note] if note else []) + tail
    text = "\n".join(lines) if lines else "(the agent made no tool calls)"
    answer = final_answer if final_answer is not None else "(no final answer)"
    answer, answer_clipped = clip(answer, max(budget_tokens // 4, 100))
    report = {"steps": len(steps), "steps_omitted": omitted, "results_clipped": clipped,
              "answer_clipped": answer_clipped}
    return text + f"\n\nFinal answer of the agent: {answer}", report


def build_messages(instruction: str, success_criteria: str, failure_criteria: str, evidence: Any,
                   steps: list[Step], final_answer: str | None, settings: JudgeSettings
                   ) -> tuple[list[dict[str, str]], dict[str, Any]]:
    trajectory, report = render_trajectory(steps, final_answer, settings.max_trajectory_tokens)
    evidence_text, evidence_clipped = clip(json.dumps(evidence, default=str, sort_keys=True, indent=1),
                                           settings.max_evidence_tokens)
    report["evidence_clipped"] = evidence_clipped
    user = "\n\n".join([
        f"## Task\n{instruction}",
        f"## Success criteria\n{success_criteria or '(none given)'}",
        f"## Failure criteria\n{failure_criteria or '(none given)'}",
        f"## Verification evidence (from the databases before and after)\n{evidence_text}",
        f"## The agent's tool calls\n{trajectory}",
    ])
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}], report


def majority(votes: list[str]) -> tuple[str, float]:
    counts = Counter(votes)
    top = max(counts.values())
    winner = next(c for c in _TIE_ORDER if counts.get(c) == top)
    return winner, top / len(votes)


class Judge:
    """One judge endpoint with its cache. Thread-compatible: use from one event loop."""

    def __init__(self, settings: JudgeSettings, api_key: str | None = None) -> None:
        self.settings = settings
        from awm.llm import LLMClient, LLMSettings

        key = api_key if api_key is not None else os.environ.get(settings.api_key_env, "")
        self._client = LLMClient(LLMSettings(
            base_url=settings.base_url.rstrip("/"), api_key=key, model=settings.model,
            embed_base_url=settings.base_url, embed_api_key=key, embed_model="", concurrency=8,
            timeout_s=settings.timeout_s, retries=settings.retries, temperature=settings.temperature,
            reasoning=settings.reasoning, reasoning_effort=settings.reasoning_effort))
        self._cache: OrderedDict[str, JudgeResult] = OrderedDict()
        self.cache_hits = 0

    async def close(self) -> None:
        await self._client.close()

    async def judge(self, instruction: str, evidence: Any, steps: list[Step], final_answer: str | None,
                    success_criteria: str = "", failure_criteria: str = "") -> JudgeResult:
        start = time.perf_counter()
        messages, truncation = build_messages(instruction, success_criteria, failure_criteria, evidence, steps,
                                              final_answer, self.settings)
        key = hashlib.sha256(json.dumps([self.settings.model, self.settings.temperature, self.settings.seed,
                                         self.settings.votes, messages]).encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            return JudgeResult(**{**hit.__dict__, "cached": True, "ms": (time.perf_counter() - start) * 1000,
                                  "prompt_tokens": 0, "completion_tokens": 0})
        try:
            result = await asyncio.wait_for(self._vote(messages), self.settings.deadline_s)
        except asyncio.TimeoutError:
            result = JudgeResult("judge_error", f"the judge did not answer within {self.settings.deadline_s:g} s")
        result.truncation, result.model = truncation, self.settings.model
        result.ms = (time.perf_counter() - start) * 1000
        if result.classification != "judge_error" and self.settings.cache_size:
            self._cache[key] = result
            while len(self._cache) > self.settings.cache_size:
                self._cache.popitem(last=False)
        return result

    async def _vote(self, messages: list[dict[str, str]]) -> JudgeResult:
        k = self.settings.votes
        temperature = self.settings.temperature if k == 1 else self.settings.vote_temperature
        outcomes = await asyncio.gather(*(self._ask(messages, self.settings.seed + i, temperature)
                                          for i in range(k)))
        prompt_tokens = sum(o[1] for o in outcomes)
        completion_tokens = sum(o[2] for o in outcomes)
        outcomes = [o[0] for o in outcomes]
        valid = [o for o in outcomes if isinstance(o, Judgement)]
        if not valid:
            errors = "; ".join(sorted({str(o) for o in outcomes}))
            return JudgeResult("judge_error", errors[:2000], [], 0.0, prompt_tokens, completion_tokens)
        winner, agreement = majority([j.classification for j in valid])
        reasoning = next(j.reasoning for j in valid if j.classification == winner)
        votes = [o.classification if isinstance(o, Judgement) else "judge_error" for o in outcomes]
        return JudgeResult(winner, reasoning, votes, agreement * len(valid) / k, prompt_tokens, completion_tokens)

    async def _ask(self, messages: list[dict[str, str]], seed: int, temperature: float
                   ) -> tuple[Judgement | str, int, int]:
        """One vote and its tokens; a malformed reply is asked again once with the error, then the
        vote counts as failed."""
        from awm.llm import LLMBadOutput, LLMUnavailable, extract_json, json_schema_format

        convo = list(messages)
        error, prompt_tokens, completion_tokens = "", 0, 0
        settings = self.settings
        budget = settings.reasoning_max_output_tokens if self._client.settings.is_reasoning else settings.max_output_tokens
        schema = json_schema_format("judgement", JUDGEMENT_SCHEMA) if settings.structured_output else None
        for _ in range(2):
            try:
                done = await self._client.chat("judge", convo, budget, extra={"seed": seed, "temperature": temperature},
                                               response_format=schema)
            except (LLMUnavailable, LLMBadOutput) as exc:
                return f"judge unavailable: {exc}", prompt_tokens, completion_tokens
            prompt_tokens += done.prompt_tokens
            completion_tokens += done.completion_tokens
            try:
                return Judgement.model_validate(extract_json(done.text)), prompt_tokens, completion_tokens
            except (ValueError, ValidationError) as exc:
                error = f"malformed judge output: {str(exc)[:300]}"
                convo = messages + [{"role": "assistant", "content": done.text[:4000]},
                                    {"role": "user", "content": error + "\nReply with only the JSON object."}]
        return error, prompt_tokens, completion_tokens
