"""What the trainer's commands (trainer/cmd_*.py, registered by trainer/cli.py) share: their common
options, the consoles they print to, and the few steps more than one of them takes.

Only typer, rich and the core's settings are imported here: ``awm --help`` imports this module
(it lists the commands), and must not load torch or the trainer's heavier modules.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from awm import settings

console = Console()
err = Console(stderr=True, soft_wrap=True)  # an error line stays one line in logs

BaseUrlOpt = Annotated[Optional[str], typer.Option(
    "--base-url", help="OpenAI-compatible endpoint of the policy (AWM_POLICY_BASE_URL, AWM_LLM_BASE_URL).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Model name (AWM_POLICY_MODEL, AWM_LLM_MODEL).")]
ApiKeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar=settings.names.AWM_POLICY_API_KEY, show_default=False,
                                                   help="API key (AWM_POLICY_API_KEY, else OPENAI_API_KEY).")]
MaxTurnsOpt = Annotated[int, typer.Option("--max-turns", min=1, help="Turns before the episode is cut.")]
WindowOpt = Annotated[Optional[int], typer.Option("--history-window", min=1,
                                                  help="Assistant turns kept in the prompt (default: all).")]
TempOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature.")]
MaxTokOpt = Annotated[int, typer.Option("--max-tokens", help="Max tokens per reply.")]
DatabaseUrlOpt = Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                                       help="External Postgres admin DSN (default: embedded).")]


class ToolFormat(str, Enum):
    native = "native"
    text = "text"
    awm = "awm"


FormatOpt = Annotated[ToolFormat, typer.Option("--tool-format", case_sensitive=False,
                                               help="native (tools parameter), text (<tool_call> in prompt) or awm "
                                                    "(the reference's list_tools/call_tool meta-tools, one call per turn).")]
ThinkingOpt = Annotated[Optional[bool], typer.Option(
    "--thinking/--no-thinking", help="Qwen3-style thinking on or off (chat_template_kwargs.enable_thinking); "
                                     "default: the template's own (on for Qwen3).")]


class ToolDescriptions(str, Enum):
    full = "full"
    short = "short"


DescriptionsOpt = Annotated[ToolDescriptions, typer.Option(
    "--tool-descriptions", case_sensitive=False,
    help="short: each tool's first sentence, parameter schemas without their prose (small models).")]
StopFormatOpt = Annotated[bool, typer.Option(
    "--stop-on-format-error", help="End an episode at its first format error (a malformed call; `awm train`: "
                              "the classes of reward.format_errors), scored reward format_error (-1).")]


def thinking_body(thinking: bool | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request body's extra fields that turn the model's thinking on or off (None: leave it)."""
    from awm.trainer.policy import with_thinking

    return with_thinking(extra or {}, thinking)


def policy_endpoint(base_url: str | None, model: str | None) -> tuple[str, str]:
    """The policy's URL and model name, from the flags or the environment; neither exits 2."""
    # As set, without the LLM endpoint's defaults: no endpoint given is an error here, not OpenAI's.
    url = base_url or settings.AWM_POLICY_BASE_URL or settings.var.AWM_LLM_BASE_URL.raw()
    name = model or settings.AWM_POLICY_MODEL or settings.var.AWM_LLM_MODEL.raw()
    if not url or not name:
        err.print("[red]error:[/red] give the policy endpoint: --base-url and --model "
                  "(or AWM_POLICY_BASE_URL / AWM_POLICY_MODEL)")
        raise typer.Exit(2)
    return url, name


def load_bundles(catalog: str, names: list[str] | None = None) -> list[Any]:
    """The catalog's environments (only ``names``, if given); a catalog that does not load exits 2."""
    from awm import catalog as catalog_mod

    try:
        return catalog_mod.load(catalog, names)
    except catalog_mod.CatalogError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
