"""Command-line options shared by every command that serves tasks (`awm serve`, `awm demo`,
`awm catalog validate`, `awm eval`): the LLM judge, the verifier kind and the gates."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from awm import settings

_err = Console(stderr=True, soft_wrap=True)

JudgeUrlOpt = Annotated[Optional[str], typer.Option(
    "--judge-base-url", envvar=settings.names.AWM_JUDGE_BASE_URL,
    help="OpenAI-compatible endpoint of the LLM judge for judge-verifier tasks (key: AWM_JUDGE_API_KEY).")]
JudgeModelOpt = Annotated[Optional[str], typer.Option("--judge-model", envvar=settings.names.AWM_JUDGE_MODEL,
                                                      help="Judge model.")]
JudgeVotesOpt = Annotated[int, typer.Option("--judge-votes", envvar=settings.names.AWM_JUDGE_VOTES, min=1,
                                            help="k-vote majority of the judge (1 = one deterministic call).")]
KindOpt = Annotated[Optional[str], typer.Option("--verifier-kind", envvar=settings.names.AWM_VERIFIER_KIND,
                                                help="Where a task has both kinds of verifier: code or judge.")]
UngatedOpt = Annotated[bool, typer.Option("--allow-ungated", envvar=settings.names.AWM_ALLOW_UNGATED,
                                          help="Also serve tasks that have not passed both gates (marked ungated).")]


def serving_options(judge_base_url: str | None, judge_model: str | None, judge_votes: int,
                    verifier_kind: str | None, allow_ungated: bool) -> dict[str, Any]:
    """LocalFleet options for the judge, the verifier kind and the gates, from the shared flags."""
    from awm.judge import JudgeSettings

    if verifier_kind not in (None, "code", "judge"):
        _err.print(f"[red]error:[/red] --verifier-kind must be code or judge, not {verifier_kind!r}")
        raise typer.Exit(2)
    if bool(judge_base_url) != bool(judge_model):
        _err.print("[red]error:[/red] a judge needs both --judge-base-url and --judge-model")
        raise typer.Exit(2)
    judge = JudgeSettings(base_url=judge_base_url, model=judge_model, votes=judge_votes) if judge_base_url else None
    return {"judge": judge, "verifier_kind": verifier_kind, "allow_ungated": allow_ungated}


