"""The hybrid reward, and which episodes must not be trained on at all.

reward = outcome reward (from the verifier's verdict: complete / incomplete)
         - format penalty per format error (capped): a call of a class in ``format_errors``,
           malformed calls by default; the paper's kit adds ``unknown_tool`` and
           ``invalid_arguments``. With the agent's early termination the first one ends the
           episode instead, scored ``format_error``.
         - optional penalty per other agent-fault tool error (``invalid_arguments``, ``tool_error``)

Our own failures are never charged to the agent. An episode is *masked* (kept in the logs,
excluded from advantages and from the loss) when

* the verifier's verdict is ``error`` (its ``error_kind`` says why: ``infra``, ``timeout``,
  ``crash``, ``memory``, ``exception``, ``query`` - a verifier that fails is an environment bug,
  whatever the agent did), or
* a tool failed for a reason that is the environment's (the environment faults of
  :mod:`awm.errorclass`: ``tool_crashed``, ``timeout``, ``unavailable``): the agent then acted on
  a broken world, so its outcome says nothing, or
* the episode could not be completed for infrastructure reasons (instance lost, control API down).

The reference system's keyword matching scores a server 500 as the agent's format error (-1);
that bias is what this module exists to avoid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from awm.errorclass import AGENT_FAULTS, CLASSES, ENVIRONMENT_FAULTS, ErrorClass

# Derived from the classes' one definition: a class added there is masked or charged here.
INFRA_TOOL_ERRORS: tuple[str, ...] = tuple(sorted(c.value for c in ENVIRONMENT_FAULTS))
AGENT_TOOL_ERRORS: tuple[str, ...] = tuple(sorted(c.value for c in AGENT_FAULTS if CLASSES[c].raised_by == "server"))
# server_error: the LLM judge found the environment failing the agent; judge: the judge failed.
VERDICT_ERROR_KINDS = ("infra", "timeout", "crash", "memory", "exception", "query", "server_error", "judge")


@dataclass
class RewardConfig:
    """The reward map (docs/training.md). Judge verdicts: complete, incomplete and agent_error are
    scored with the values below; server_error and judge_error are masked (never charged)."""

    complete: float = 1.0
    incomplete: float = 0.0
    agent_error: float = 0.0  # the judge says the agent misused the tools and did not finish
    format_penalty: float = 0.1  # per malformed tool call (step-level)
    tool_error_penalty: float = 0.0  # per result of an agent-fault class the server raised (AGENT_TOOL_ERRORS), not a format error
    max_penalty: float = 0.5  # the penalties together never exceed this
    # an episode ended early on a malformed call (agent.stop_on_format_error): this reward instead
    # of its verdict (OpenEnv's value for the reference's format errors)
    format_error: float = -1.0
    # Which verdict-error kinds are ours (masked). Anything else is scored as `incomplete`.
    masked_verdict_kinds: tuple[str, ...] = VERDICT_ERROR_KINDS
    masked_tool_errors: tuple[str, ...] = INFRA_TOOL_ERRORS
    # The tool-call error classes that are format errors: each costs format_penalty (not also
    # tool_error_penalty), and with agent.stop_on_format_error the first ends the episode, scored
    # format_error. Agent faults only: an environment's failure masks the episode instead.
    format_errors: tuple[ErrorClass, ...] = (ErrorClass.MALFORMED,)

    def __post_init__(self) -> None:
        # A misspelt class would silently never match: every such call would cost nothing.
        self.format_errors = format_error_classes(self.format_errors)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RewardConfig:
        data = dict(data or {})
        for key in ("masked_verdict_kinds", "masked_tool_errors", "format_errors"):
            if isinstance(data.get(key), list):
                data[key] = tuple(data[key])
        return cls(**data)


def format_error_classes(values: Any) -> tuple[ErrorClass, ...]:
    """``values`` (class names or members) as error classes that may be format errors: known
    classes, each an agent fault; anything else is refused with the classes it may be."""
    allowed = ", ".join(sorted(c.value for c in AGENT_FAULTS))
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise ValueError(f"reward.format_errors must be a list of error classes ({allowed})")
    out: list[ErrorClass] = []
    for value in values:
        try:
            kind = ErrorClass(value)
        except ValueError:
            raise ValueError(f"reward.format_errors: {value!r} is not an error class ({allowed})") from None
        if kind not in AGENT_FAULTS:
            raise ValueError(f"reward.format_errors: {kind.value} is the environment's fault (the episode is "
                             f"masked, never charged); format errors are the agent's: {allowed}")
        if kind not in out:
            out.append(kind)
    return tuple(out)


@dataclass
class RewardResult:
    reward: float
    masked: bool
    mask_reason: str | None = None
    components: dict[str, float] = field(default_factory=dict)


def score(verdict: dict[str, Any] | None, tool_error_kinds: list[str], malformed_calls: int,
          infra_error: str | None = None, cfg: RewardConfig | None = None) -> RewardResult:
    """Reward of one episode from its verdict (control API ``/verify``) and per-step events.

    ``tool_error_kinds`` holds the error class of every failed tool call of the episode.
    """
    cfg = cfg or RewardConfig()
    if infra_error:
        return RewardResult(0.0, True, f"infrastructure: {infra_error}")
    ours = [k for k in tool_error_kinds if k in cfg.masked_tool_errors]
    if ours:
        return RewardResult(0.0, True, f"environment tool failure: {', '.join(sorted(set(ours)))}")
    verdict = verdict or {}
    outcome = verdict.get("verdict")
    if outcome == "format_error":  # early termination: the whole reward, no penalties on top
        return RewardResult(cfg.format_error, False, None, {"outcome": cfg.format_error})
    if outcome == "error":
        kind = verdict.get("error_kind") or "unknown"
        if kind in cfg.masked_verdict_kinds or kind == "unknown":
            return RewardResult(0.0, True, f"verifier error ({kind}): {verdict.get('reason', '')}"[:300])
    base = {"complete": cfg.complete, "agent_error": cfg.agent_error}.get(str(outcome), cfg.incomplete)
    fmt = cfg.format_penalty * format_error_count(tool_error_kinds, malformed_calls, cfg)
    tool = cfg.tool_error_penalty * sum(1 for k in tool_error_kinds
                                        if k in AGENT_TOOL_ERRORS and k not in cfg.format_errors)
    penalty = min(fmt + tool, cfg.max_penalty)
    return RewardResult(base - penalty, False, None,
                        {"outcome": base, "format_penalty": -fmt, "tool_error_penalty": -tool,
                         "penalty_applied": -penalty})


def format_error_count(tool_error_kinds: list[str], malformed_calls: int, cfg: RewardConfig) -> int:
    """The episode's format errors: its malformed calls (counted by the caller) when malformed
    calls are format errors, plus its failed calls of the other format-error classes."""
    count = malformed_calls if ErrorClass.MALFORMED in cfg.format_errors else 0
    return count + sum(1 for k in tool_error_kinds if k != ErrorClass.MALFORMED and k in cfg.format_errors)
