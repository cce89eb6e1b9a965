"""``awm agent``: one task with a model endpoint on a running instance, shown turn by turn.

Exit codes: 0 the episode ran, 1 the instance could not be reached or the episode ended in an
infrastructure error, 2 bad input, 3 the policy endpoint is unavailable.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.panel import Panel

from awm.trainer.cmd_options import (ApiKeyOpt, BaseUrlOpt, DescriptionsOpt, FormatOpt, MaxTokOpt, MaxTurnsOpt,
                                     ModelOpt, StopFormatOpt, TempOpt, ThinkingOpt, ToolDescriptions, ToolFormat,
                                     WindowOpt, console, err, policy_endpoint, thinking_body)


def agent(
    mcp_url: Annotated[str, typer.Option("--mcp-url", help="MCP URL of the instance (…/mcp).")],
    control_url: Annotated[str, typer.Option("--control-url", help="Control URL of the same instance.")],
    task: Annotated[str, typer.Option("--task", help="Task id to run.")],
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    max_turns: MaxTurnsOpt = 30,
    history_window: WindowOpt = None,
    tool_format: FormatOpt = ToolFormat.native,
    temperature: TempOpt = 1.0,
    max_tokens: MaxTokOpt = 2048,
    thinking: ThinkingOpt = None,
    stop_on_format_error: StopFormatOpt = False,
    tool_descriptions: DescriptionsOpt = ToolDescriptions.full,
    out: Annotated[Path, typer.Option("--out", help="Trajectory JSONL (appended, one line per turn).")] = Path(
        "runs/agent/trajectories.jsonl"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the finished trajectory as JSON.")] = False,
) -> None:
    """Run one task with a model endpoint on a running instance, turn by turn, for a human to watch."""
    from awm.client import ControlApiError, McpError
    from awm.trainer.agent import AgentConfig, EnvHandle, run_episode
    from awm.trainer.policy import OpenAIPolicy, PolicyUnavailable
    from awm.trainer.trajectory import TrajectoryLog

    url, name = policy_endpoint(base_url, model)
    cfg = AgentConfig(max_turns=max_turns, history_window=history_window, tool_format=tool_format.value,
                      stop_on_format_error=stop_on_format_error, tool_descriptions=tool_descriptions.value)

    def show(traj: Any, turn: Any) -> None:
        if not as_json:
            _show_turn(traj, turn)

    async def run() -> Any:
        policy = OpenAIPolicy(url, name, api_key or "", temperature=temperature, max_tokens=max_tokens,
                              extra_body=thinking_body(thinking))
        log = TrajectoryLog(out)
        try:
            env = await EnvHandle.connect(mcp_url, control_url)
        except (McpError, ControlApiError, OSError) as exc:
            await policy.close()
            raise _EnvUnreachable(str(exc)) from exc
        try:
            if not as_json:
                console.print(f"[bold]{env.env}[/bold] · task [bold]{task}[/bold] · {len(env.tools)} tools · "
                              f"model {name} at {url}")
            return await run_episode(policy, env, task, cfg, log=log, on_turn=show)
        finally:
            await env.close()
            await policy.close()
            log.close()

    try:
        traj = asyncio.run(run())
    except PolicyUnavailable as exc:
        err.print(f"[red]error: the policy endpoint is unavailable:[/red] {exc}")
        raise typer.Exit(3) from exc
    except _EnvUnreachable as exc:
        err.print(f"[red]error: cannot reach the instance:[/red] {exc}")
        raise typer.Exit(1) from exc
    if as_json:
        print(json.dumps(traj.to_dict(), default=str))
    else:
        _show_outcome(traj, out)
    if traj.stop_reason == "infra_error":
        raise typer.Exit(1)


class _EnvUnreachable(RuntimeError):
    pass


def _show_turn(traj: Any, turn: Any) -> None:
    """One turn as a panel (the instruction before the first): what the model said, each call it
    made and what the tool answered, shortened so that a long result does not hide the rest."""
    if turn.index == 0:
        console.print(f"[bold]instruction:[/bold] {traj.instruction}")
    head = f"turn {turn.index + 1} · policy {turn.policy_ms:.0f} ms · tools {turn.tools_ms:.0f} ms"
    body = []
    text = turn.assistant.get("content")
    if text:
        body.append(f"[bold]assistant:[/bold] {_short(text)}")
    for call, result in zip(turn.tool_calls, turn.results):
        label = call.get("name") or "(malformed)"
        args = json.dumps(call.get("arguments")) if not call.get("malformed") else call.get("raw", "")
        style = "red" if result["is_error"] else "green"
        body.append(f"[cyan]→ {label}[/cyan] {_short(args, 200)}")
        body.append(f"[{style}]← {_short(result['text'], 300)}[/{style}]")
    console.print(Panel("\n".join(body) or "(empty reply)", title=head, title_align="left"))


def _show_outcome(traj: Any, out: Path) -> None:
    """The finished episode in a few lines: verdict, reward, why it stopped, the database's changes
    and where the trajectory was written."""
    verdict = traj.verdict
    style = "green" if verdict.get("verdict") == "complete" else "red"
    console.print(f"verdict: [{style}]{verdict.get('verdict')}[/{style}] ({verdict.get('reason', '')}) · "
                  f"reward {traj.reward:g}{' (masked: ' + str(traj.mask_reason) + ')' if traj.masked else ''} · "
                  f"{len(traj.turns)} turns · stop: {traj.stop_reason} · {traj.timings.get('wall_ms', 0):.0f} ms")
    if traj.diff:
        console.print("db diff: " + ", ".join(f"{t}: +{d['inserted']} ~{d['updated']} -{d['deleted']}"
                                               for t, d in traj.diff.items()))
    console.print(f"trajectory: {out}")


def _short(text: str | None, limit: int = 400) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more chars]"
