"""The classes of a failed tool call: the one definition every layer reads.

A trainer must tell the agent's mistakes from the environment's failures: the reference system
scores a server bug as the agent's format error, which trains the policy on noise. So every failed
call carries one of these classes, decided where the failure happens (the env server's tool
runtime, or the client for a call that never reached it), sent in the MCP result's
``_meta.awm_error`` field and, for readers of text only, as the first word of the error text.

What each class means for a reward (charged to the agent, or masking the episode), for OpenEnv's
AWM protocol (its ``reward_type``) and for OpenEnv's generic MCP error types is a property of the
class, below, so that adding a class is one entry here plus the code that raises it; the reward,
the adapters, the metrics, the UI and the docs read it from this module
(tests/test_errorclass.py fails when a class is missing from any of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

__all__ = ["AGENT_FAULTS", "CLASSES", "ENVIRONMENT_FAULTS", "ErrorClass", "ErrorInfo", "parse"]


class ErrorClass(StrEnum):
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_ERROR = "tool_error"
    TOOL_CRASHED = "tool_crashed"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    MALFORMED = "malformed"
    TOO_MANY_CALLS = "too_many_calls"


Fault = Literal["agent", "environment"]
# OpenEnv's AWM environment's per-step reward types for a tool call (its README and models).
OpenEnvRewardType = Literal["tool_not_found", "invalid_args", "server_error"]
# OpenEnv's generic MCP error types (openenv.core.env_server.mcp_types.ToolErrorType values).
OpenEnvErrorType = Literal["tool_not_found", "invalid_args", "execution_error", "timeout", "transport_error"]


@dataclass(frozen=True)
class ErrorInfo:
    """What a class means. ``fault``: whose doing it is (an environment fault masks the episode:
    reward None, never trained on); ``raised_by``: the env server, or the client for a call that
    never reached it; ``openenv``: OpenEnv's AWM ``reward_type`` for it; ``mcp_error_type``:
    OpenEnv's generic MCP error type."""

    fault: Fault
    raised_by: Literal["server", "client"]
    meaning: str
    openenv: OpenEnvRewardType
    mcp_error_type: OpenEnvErrorType


CLASSES: dict[ErrorClass, ErrorInfo] = {
    ErrorClass.INVALID_ARGUMENTS: ErrorInfo(
        "agent", "server", "the arguments do not match the tool's input schema", "invalid_args", "invalid_args"),
    ErrorClass.UNKNOWN_TOOL: ErrorInfo(
        "agent", "server", "no tool of that name in this environment", "tool_not_found", "tool_not_found"),
    ErrorClass.TOOL_ERROR: ErrorInfo(
        "agent", "server", "the tool refused the request (an unknown id, a rule of the app, a constraint)",
        "server_error", "execution_error"),
    ErrorClass.TOOL_CRASHED: ErrorInfo(
        "environment", "server", "the tool's code failed (a bug of the environment)", "server_error",
        "execution_error"),
    ErrorClass.TIMEOUT: ErrorInfo(
        "environment", "server", "the tool ran past its time limit", "server_error", "timeout"),
    ErrorClass.UNAVAILABLE: ErrorInfo(
        "environment", "server", "the database, the worker or the instance went away", "server_error",
        "transport_error"),
    ErrorClass.MALFORMED: ErrorInfo(
        "agent", "client", "the policy's tool call could not be parsed", "invalid_args", "invalid_args"),
    ErrorClass.TOO_MANY_CALLS: ErrorInfo(
        "agent", "client", "more calls in one reply than the loop executes", "invalid_args", "invalid_args"),
}

AGENT_FAULTS: frozenset[ErrorClass] = frozenset(c for c, i in CLASSES.items() if i.fault == "agent")
ENVIRONMENT_FAULTS: frozenset[ErrorClass] = frozenset(c for c, i in CLASSES.items() if i.fault == "environment")


def parse(value: object) -> ErrorClass | None:
    """The class named by ``value`` (a ``_meta.awm_error`` field, or an error text's first word),
    or None when it names none: an unknown name is not guessed at."""
    if isinstance(value, ErrorClass):
        return value
    if not isinstance(value, str):
        return None
    head = value.split(":", 1)[0].strip()
    try:
        return ErrorClass(head)
    except ValueError:
        return None
