"""``awm agent``, ``awm train`` and ``awm eval`` (merged into the ``awm`` command by awm/cli.py).

Imports stay inside the commands, so ``awm`` without the trainer extra (no torch) still starts.
Exit codes: 0 success, 1 failed episode / run, 2 bad input, 3 policy endpoint unavailable.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from awm import settings
from awm.serveopts import JudgeModelOpt, JudgeUrlOpt, JudgeVotesOpt, KindOpt, UngatedOpt, serving_options

trainer_app = typer.Typer()
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
class ToolFormat(str, Enum):
    native = "native"
    text = "text"
    awm = "awm"


class VerifierKind(str, Enum):
    code = "code"
    judge = "judge"


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


def _thinking_body(thinking: bool | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    from awm.trainer.policy import with_thinking

    return with_thinking(extra or {}, thinking)
TempOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature.")]
MaxTokOpt = Annotated[int, typer.Option("--max-tokens", help="Max tokens per reply.")]


def _endpoint(base_url: str | None, model: str | None) -> tuple[str, str]:
    # As set, without the LLM endpoint's defaults: no endpoint given is an error here, not OpenAI's.
    url = base_url or settings.AWM_POLICY_BASE_URL or settings.var.AWM_LLM_BASE_URL.raw()
    name = model or settings.AWM_POLICY_MODEL or settings.var.AWM_LLM_MODEL.raw()
    if not url or not name:
        err.print("[red]error:[/red] give the policy endpoint: --base-url and --model "
                  "(or AWM_POLICY_BASE_URL / AWM_POLICY_MODEL)")
        raise typer.Exit(2)
    return url, name


def _short(text: str | None, limit: int = 400) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more chars]"


@trainer_app.command()
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

    url, name = _endpoint(base_url, model)
    cfg = AgentConfig(max_turns=max_turns, history_window=history_window, tool_format=tool_format.value,
                      stop_on_format_error=stop_on_format_error, tool_descriptions=tool_descriptions.value)

    def show(traj: Any, turn: Any) -> None:
        if as_json:
            return
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

    async def run() -> Any:
        policy = OpenAIPolicy(url, name, api_key or "", temperature=temperature, max_tokens=max_tokens,
                              extra_body=_thinking_body(thinking))
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
        verdict = traj.verdict
        style = "green" if verdict.get("verdict") == "complete" else "red"
        console.print(f"verdict: [{style}]{verdict.get('verdict')}[/{style}] ({verdict.get('reason', '')}) · "
                      f"reward {traj.reward:g}{' (masked: ' + str(traj.mask_reason) + ')' if traj.masked else ''} · "
                      f"{len(traj.turns)} turns · stop: {traj.stop_reason} · {traj.timings.get('wall_ms', 0):.0f} ms")
        if traj.diff:
            console.print("db diff: " + ", ".join(f"{t}: +{d['inserted']} ~{d['updated']} -{d['deleted']}"
                                                   for t, d in traj.diff.items()))
        console.print(f"trajectory: {out}")
    if traj.stop_reason == "infra_error":
        raise typer.Exit(1)


class _EnvUnreachable(RuntimeError):
    pass


@trainer_app.command()
def train(
    config: Annotated[Path, typer.Option("--config", "-c", exists=True, dir_okay=False, help="Training YAML.")],
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Override the number of steps.")] = None,
    run_dir: Annotated[Optional[str], typer.Option("--run-dir", help="Override the run directory.")] = None,
    mode: Annotated[Optional[str], typer.Option("--mode", help="async | sync")] = None,
    metrics_port: Annotated[Optional[int], typer.Option("--metrics-port", help="Serve Prometheus metrics here.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed")] = None,
    database_url: Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                                       help="External Postgres admin DSN (default: embedded).")] = None,
    verifier_kind: Annotated[Optional[VerifierKind], typer.Option(
        "--verifier-kind", help="Override the config's verifier_kind (where a task has both): code is the "
                                "paper kit's code-only ablation of its judge reward.")] = None,
) -> None:
    """GRPO on a local fleet: rollouts, learner, checkpoints, metrics JSONL and a reward curve.
    ``--verifier-kind code`` overrides the config's verifier_kind (the paper kit's code-only
    ablation of its judge reward: docs/reproduce.md)."""
    from awm.trainer.config import TrainConfig

    try:
        cfg = TrainConfig.load(config, {"steps": steps, "run_dir": run_dir, "mode": mode,
                                        "metrics_port": metrics_port, "seed": seed, "database_url": database_url,
                                        "verifier_kind": verifier_kind.value if verifier_kind else None})
    except (ValueError, TypeError) as exc:
        err.print(f"[red]error in {config}:[/red] {exc}")
        raise typer.Exit(2) from exc
    from awm.trainer.run import train as run_training
    from awm.trainer.policy import PolicyUnavailable
    from awm.trainer.rollout import InstancesUnavailable

    console.print(f"awm train: {cfg.catalog} · {cfg.steps} steps × {cfg.groups_per_step} groups × "
                  f"{cfg.rollout.group_size} episodes · {cfg.mode} · run dir {cfg.run_dir}")

    def show(r: dict[str, Any]) -> None:
        console.print(f"step {r['step']:>4}  reward {r['reward_mean'] if r['reward_mean'] is not None else '-':>7}  "
                      f"success {r['success_rate'] if r['success_rate'] is not None else '-':>6}  "
                      f"masked {r['masked']}  rollouts/s {r['rollouts_per_s']:.2f}  "
                      f"env wait {r['env_wait_fraction']:.2f}  staleness {max(r['staleness'], default=0)}  "
                      f"loss {r['loss'] if r['loss'] is not None else '-'}")

    from awm.fleet import FleetError

    try:
        result = asyncio.run(run_training(cfg, on_step=show))
    except PolicyUnavailable as exc:
        err.print(f"[red]error: the policy is unavailable:[/red] {exc}")
        raise typer.Exit(3) from exc
    except InstancesUnavailable as exc:
        err.print(f"[red]error: the environment instances are unavailable:[/red] {exc}")
        raise typer.Exit(3) from exc
    except (ValueError, FleetError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"reward: first step {result.first_reward} → last step {result.last_reward} "
                  f"({result.steps} steps)")
    console.print(f"wrote {result.run_dir / 'metrics.jsonl'}, {result.run_dir / 'reward_curve.png'}, "
                  f"{result.run_dir / 'trajectories.jsonl'}, {result.run_dir / 'checkpoints'}")
    if cfg.learner.distributed:  # a torchrun rank: a normal exit may abort in gloo's threads
        from awm.trainer.distributed import leave

        leave(0)


def _evaluation_defaults(path: Path, given: set[str]) -> dict[str, Any]:
    """What a training config says about evaluating its checkpoints (``evaluation``: the paper pins
    decoding and history apart from training; the agent's turns, tool format and format rules; the
    policy's thinking), as ``awm eval``'s parameters, leaving out those the command line gave."""
    from awm.trainer.config import TrainConfig

    cfg = TrainConfig.load(path)
    ev, agent = cfg.evaluation, cfg.agent
    values: dict[str, Any] = {"temperature": ev.temperature, "max_turns": agent.max_turns,
                              "history_window": ev.history_window if ev.history_window is not None else agent.history_window,
                              "tool_format": agent.tool_format, "stop_on_format_error": agent.stop_on_format_error,
                              "thinking": cfg.policy.thinking, "max_tokens": cfg.policy.max_new_tokens}
    out = {k: v for k, v in values.items() if k not in given}
    out["require_thinking"] = agent.require_thinking and "thinking" not in given
    sampling = {k: v for k, v in (("top_p", ev.top_p), ("top_k", ev.top_k)) if v is not None}
    if sampling and "extra_body" not in given:
        out["sampling"] = sampling
    return out


@trainer_app.command("eval")
def eval_command(
    ctx: typer.Context,
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="A training config (e.g. examples/paper/qwen3-8b.yaml): its `evaluation` section "
                         "(temperature, top-p, top-k, history window), its agent's turns, tool format and format "
                         "rules and its policy's thinking become this evaluation's defaults; a flag given wins.")] = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    checkpoint: Annotated[Optional[Path], typer.Option(
        "--checkpoint", help="Evaluate a local checkpoint of `awm train` instead of an endpoint.")] = None,
    catalog: Annotated[str, typer.Option("--catalog", "-c", help="Catalog directory or archive.")] = "starter",
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Only these environments.")] = None,
    task: Annotated[Optional[list[str]], typer.Option("--task", help="Only these task ids.")] = None,
    k: Annotated[int, typer.Option("-k", min=1, help="Samples per task.")] = 4,
    replicas: Annotated[int, typer.Option("--replicas", "-n", min=1, help="Instances per environment.")] = 2,
    instances: Annotated[Optional[int], typer.Option(
        "--instances", min=1, help="Instances in all, each switched to the environment a task needs "
        "(late binding; instead of --replicas: a large catalog needs no instance per environment).")] = None,
    max_turns: MaxTurnsOpt = 30,
    history_window: WindowOpt = None,
    tool_format: FormatOpt = ToolFormat.native,
    temperature: TempOpt = 1.0,
    max_tokens: MaxTokOpt = 2048,
    thinking: ThinkingOpt = None,
    stop_on_format_error: StopFormatOpt = False,
    tool_descriptions: DescriptionsOpt = ToolDescriptions.full,
    retries: Annotated[int, typer.Option("--retries", min=1, help="Attempts per request on 429/5xx/unreachable "
                                         "(backoff 0.5 s doubling to 30 s, or the server's Retry-After).")] = 6,
    request_timeout: Annotated[float, typer.Option("--request-timeout", min=1, help="Seconds per request.")] = 300.0,
    extra_body: Annotated[Optional[str], typer.Option(
        "--extra-body", help='JSON merged into every request (null drops a field), e.g. '
                             '\'{"max_tokens": null, "max_completion_tokens": 4096}\' or vLLM sampling options.')] = None,
    out: Annotated[Path, typer.Option("--out", help="Directory for eval.json, eval.png, trajectories.jsonl.")] = Path(
        "runs/eval"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    database_url: Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                                       help="External Postgres admin DSN (default: embedded).")] = None,
    judge_base_url: JudgeUrlOpt = None,
    judge_model: JudgeModelOpt = None,
    judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None,
    allow_ungated: UngatedOpt = False,
    suite: Annotated[Optional[str], typer.Option(
        "--suite", help="Run an out-of-distribution benchmark's own harness instead: bfcl, tau2 or mcp-universe "
                        "(docs/integrations.md). -k is then tau2's trials per task.")] = None,
    suite_python: Annotated[Optional[str], typer.Option(
        "--suite-python", help="A Python with the benchmark installed (default: its cached virtualenv, made on "
                               "first use).")] = None,
    category: Annotated[Optional[list[str]], typer.Option(
        "--category", help="Suite categories: BFCL test categories, tau2 domains, MCP-Universe domains.")] = None,
    case: Annotated[Optional[list[str]], typer.Option(
        "--case", help="Only these suite cases, as CATEGORY:ID (e.g. simple_python:simple_python_0, airline:9).")] = None,
    num_tasks: Annotated[Optional[int], typer.Option("--num-tasks", min=1, help="tau2: the first N tasks per domain.")] = None,
    user_base_url: Annotated[Optional[str], typer.Option(
        "--user-base-url", help="tau2's user simulator endpoint (default: the policy's).")] = None,
    user_model: Annotated[Optional[str], typer.Option("--user-model", help="tau2's user simulator model.")] = None,
    benchmark_config: Annotated[Optional[list[str]], typer.Option(
        "--benchmark-config", help="MCP-Universe: its benchmark YAML files (from its repository).")] = None,
    max_steps: Annotated[int, typer.Option(
        "--max-steps", min=1, help="tau2: steps (agent and user turns) before a conversation is cut.")] = 100,
) -> None:
    """pass@1 and pass@k per environment for a model endpoint (k samples of every task); with
    --suite, a published benchmark's own harness and evaluator, in a table shaped like the AWM paper's."""
    pinned: dict[str, Any] = {}
    if config is not None:  # the config's evaluation settings, where no flag says otherwise
        # (by name: typer ships its own click, whose ParameterSource is not click's)
        given = {name for name in ctx.params
                 if getattr(ctx.get_parameter_source(name), "name", "") not in ("DEFAULT", "DEFAULT_MAP")}
        try:
            pinned = _evaluation_defaults(config, given)
        except (OSError, ValueError) as exc:
            err.print(f"[red]error:[/red] --config {config}: {exc}")
            raise typer.Exit(2) from exc
        temperature = pinned.pop("temperature", temperature)
        max_turns = pinned.pop("max_turns", max_turns)
        history_window = pinned.pop("history_window", history_window)
        tool_format = ToolFormat(pinned.pop("tool_format", tool_format.value))
        thinking = pinned.pop("thinking", thinking)
        stop_on_format_error = pinned.pop("stop_on_format_error", stop_on_format_error)
        max_tokens = pinned.pop("max_tokens", max_tokens)
        if pinned.get("sampling"):  # top-p and top-k, in every request's body (vLLM and OpenAI-style servers)
            merged = {**pinned["sampling"], **(json.loads(extra_body) if extra_body else {})}
            extra_body = json.dumps(merged)
    if suite is not None:
        _suite(suite, base_url, model, api_key, temperature, out, suite_python, category, case, num_tasks, k,
               user_base_url, user_model, benchmark_config, max_steps)
        return
    from awm import catalog as catalog_mod
    from awm.episode.allocation import OperatorSettings
    from awm.episode.reward import RewardConfig
    from awm.episode.sources import run_source
    from awm.trainer import eval as ev
    from awm.trainer.agent import AgentConfig
    from awm.trainer.policy import OpenAIPolicy, PolicyUnavailable
    from awm.trainer.k8s_source import ProgressReporter
    from awm.trainer.trajectory import TrajectoryLog

    try:
        bundles = catalog_mod.load(catalog, env or None)
    except catalog_mod.CatalogError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, allow_ungated)
    tasks = ev.select_tasks(bundles, task, allow_ungated, verifier_kind)
    if not tasks:
        err.print("[red]error:[/red] no tasks selected (only tasks that passed both gates are evaluated unless "
                  "--allow-ungated; `awm catalog validate --record` records the gates)")
        raise typer.Exit(2)
    evaluated: dict[str, Any] | None = None
    if checkpoint is not None:
        if checkpoint.is_file() and checkpoint.name == "latest":  # RUN/checkpoints/latest names the step
            checkpoint = checkpoint.parent / checkpoint.read_text().strip()
        policy, name = _checkpoint_policy(checkpoint, temperature, thinking), str(checkpoint)
        evaluated = ev.checkpoint_of(checkpoint)
    else:
        url, name = _endpoint(base_url, model)
        try:
            extra = json.loads(extra_body) if extra_body else {}
            if not isinstance(extra, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            err.print(f"[red]error:[/red] --extra-body: {exc}")
            raise typer.Exit(2) from exc
        policy = OpenAIPolicy(url, name, api_key or "", temperature=temperature, max_tokens=max_tokens,
                              timeout_s=request_timeout, retries=retries, extra_body=_thinking_body(thinking, extra))
    cfg = AgentConfig(max_turns=max_turns, history_window=history_window, tool_format=tool_format.value,
                      stop_on_format_error=stop_on_format_error, tool_descriptions=tool_descriptions.value,
                      require_thinking=bool(pinned.get("require_thinking", False)))
    out.mkdir(parents=True, exist_ok=True)
    # what produced the numbers, in the report: two evaluations are comparable only if these agree
    run_settings = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "temperature": temperature, "max_tokens": max_tokens, "max_turns": max_turns,
                    "history_window": history_window, "tool_format": tool_format.value,
                    "tool_descriptions": tool_descriptions.value, "thinking": thinking,
                    "verifier_kind": verifier_kind, "catalog": str(catalog), "tasks_selected": len(tasks),
                    **({"config": str(config), **(pinned.get("sampling") or {})} if config is not None else {})}

    def progress(score: Any) -> None:
        if not as_json:
            console.print(f"  {score.env}/{score.task_id}: {score.complete}/{score.samples} complete"
                          f"{f', {score.masked} masked' if score.masked else ''}")

    k8s = OperatorSettings.from_env()  # inside a campaign's Job: the campaign's fleet
    reporter = ProgressReporter(k8s) if k8s is not None and k8s.campaign else None
    done: list[Any] = []

    def on_task(score: Any) -> None:
        progress(score)
        done.append(score)
        if reporter is not None:
            reporter.report(**ev.running_summary(done))

    async def run() -> list[Any]:
        log = TrajectoryLog(out / "trajectories.jsonl")
        try:
            async with run_source(bundles, replicas, k, database_url=database_url, settings=k8s, instances=instances,
                                  **serving) as source:
                return await ev.evaluate(source, policy, tasks, k, cfg, RewardConfig(), log, on_task)
        finally:
            await policy.close()
            log.close()
            if reporter is not None:
                await reporter.aclose()

    if not as_json:
        console.print(f"awm eval: {name} · {len(tasks)} tasks × k={k} · {len(bundles)} environments")
    from awm.fleet import FleetError
    from awm.trainer.rollout import InstancesUnavailable

    try:
        scores = asyncio.run(run())
    except FleetError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    except (PolicyUnavailable, InstancesUnavailable) as exc:
        # What finished is kept: a partial report, marked as such, next to the trajectories.
        what = "policy" if isinstance(exc, PolicyUnavailable) else "instances"
        partial = {**ev.report(ev.by_environment(done), k, name, run_settings, evaluated),
                   "incomplete": f"{what} unavailable: {exc}",
                   "tasks_selected": len(tasks)}
        (out / "eval.json").write_text(json.dumps(partial, indent=2))
        err.print(f"[red]error: the {'policy endpoint is' if what == 'policy' else 'environment instances are'} "
                  f"unavailable:[/red] {exc}")
        err.print(f"{len(done)} of {len(tasks)} tasks finished before that: partial report in {out / 'eval.json'}")
        raise typer.Exit(3) from exc
    data = ev.report(scores, k, name, run_settings, evaluated)
    (out / "eval.json").write_text(json.dumps(data, indent=2))
    ev.plot(data, out / "eval.png")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table(title=f"awm eval: {name}, k={k}")
    passes = ["pass@1"] if k == 1 else ["pass@1", f"pass@{k}"]  # with k=1 they are one column
    for col in ("environment", "tasks", "episodes", "masked", *passes, "mean reward"):
        table.add_column(col, justify="left" if col == "environment" else "right")
    for e in data["environments"]:
        table.add_row(e["env"], str(e["tasks"]), str(e["episodes"]), str(e["masked"]), *(_pct(e[c]) for c in passes),
                      "-" if e["mean_reward"] is None else f"{e['mean_reward']:.3f}")
    o = data["overall"]
    table.add_section()
    table.add_row("all", str(o["tasks"]), str(o["episodes"]), str(o["masked"]), *(_pct(o[c]) for c in passes), "")
    console.print(table)
    if o["short"]:
        console.print(f"{o['short']} task(s) kept fewer than {k} scored samples (episodes masked by our own "
                      f"failures): they count in pass@1, not in pass@{k}")
    console.print(f"wrote {out / 'eval.json'}, {out / 'eval.png'}, {out / 'trajectories.jsonl'}")


def _suite(suite: str, base_url: str | None, model: str | None, api_key: str | None, temperature: float, out: Path,
           python: str | None, categories: list[str] | None, cases: list[str] | None, num_tasks: int | None,
           trials: int, user_base_url: str | None, user_model: str | None, configs: list[str] | None,
           max_steps: int = 100) -> None:
    from awm.trainer.suites.proc import HarnessError
    from awm.trainer.suites.run import SUITES, run_suite
    from awm.trainer.suites.table import Endpoint

    if suite not in SUITES:
        err.print(f"[red]error:[/red] --suite {suite!r}: one of {', '.join(SUITES)}")
        raise typer.Exit(2)
    url, name = _endpoint(base_url, model)
    key = api_key or os.environ.get("OPENAI_API_KEY", "")
    policy = Endpoint(url, name, key, temperature)
    user = Endpoint(user_base_url or url, user_model or name, key, temperature)
    try:
        run_suite(suite, policy, out, console, python=python, categories=categories, cases=cases,
                  num_tasks=num_tasks, trials=trials, user=user, configs=configs, max_steps=max_steps)
    except (ValueError, HarnessError, RuntimeError) as exc:  # bad input: 2; the harness failed: 1
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2 if isinstance(exc, ValueError) else 1) from exc


@trainer_app.command("warmstart")
def warmstart_command(
    model: Annotated[Path, typer.Option("--model", exists=True, file_okay=False,
                                        help="The model directory to start from (transformers; local files only).")],
    out: Annotated[Path, typer.Option("--out", help="Where the fine-tuned model directory is written.")],
    catalog: Annotated[str, typer.Option("--catalog", "-c", help="Catalog whose reference solutions teach.")] = "starter",
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Only these environments.")] = None,
    task: Annotated[Optional[list[str]], typer.Option("--task", help="Only these task ids.")] = None,
    chat_template: Annotated[Optional[Path], typer.Option(
        "--chat-template", exists=True, dir_okay=False,
        help="The template the server applies (its --chat-template); default: the tokenizer's own.")] = None,
    epochs: Annotated[int, typer.Option("--epochs", min=1)] = 3,
    lr: Annotated[float, typer.Option("--lr", min=0.0)] = 2e-4,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per optimiser step.")] = 4,
    lora_rank: Annotated[int, typer.Option("--lora-rank", min=0, help="0: train every weight.")] = 16,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    tool_format: FormatOpt = ToolFormat.native,
    tool_descriptions: DescriptionsOpt = ToolDescriptions.full,
    instances: Annotated[int, typer.Option("--instances", min=1, help="Instances that replay the solutions.")] = 2,
    database_url: Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                                       help="External Postgres admin DSN (default: embedded).")] = None,
    allow_ungated: UngatedOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
) -> None:
    """A supervised warm start: fine-tune a model on the catalog's reference solutions, replayed
    through the agent loop as the policy will see them (trainer/warmstart.py)."""
    from awm import catalog as catalog_mod
    from awm.episode.sources import run_source
    from awm.trainer import warmstart as ws
    from awm.trainer.agent import AgentConfig

    try:
        bundles = catalog_mod.load(catalog, env or None)
        cfg = ws.WarmStartConfig(epochs=epochs, lr=lr, batch_size=batch_size, lora_rank=lora_rank, seed=seed)
        ws.check_output(out, model)
    except (catalog_mod.CatalogError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    tasks, skipped = ws.demonstration_tasks(bundles, task, allow_ungated)
    if not tasks:
        err.print("[red]error:[/red] no task with a reference solution selected (only gated tasks unless "
                  f"--allow-ungated){': ' + '; '.join(f'{k}: {v}' for k, v in skipped.items()) if skipped else ''}")
        raise typer.Exit(2)
    listing = 1 if tool_format == ToolFormat.awm else 0  # the AWM format lists the tools first
    agent = AgentConfig(max_turns=max(len(t.solution) for b in bundles for t in b.tasks) + 1 + listing,
                        tool_format=tool_format.value, tool_descriptions=tool_descriptions.value, call_diff_rows=0)

    def on_step(epoch: int, step: int, loss: float) -> None:
        if not as_json:
            console.print(f"epoch {epoch + 1}  step {step:4d}  loss {loss:.4f}")

    async def replay() -> Any:
        async with run_source(bundles, 1, 1, database_url=database_url, instances=min(instances, len(tasks)),
                              allow_ungated=allow_ungated) as source:
            return await ws.demonstrations(source, bundles, tasks, agent)

    if not as_json:
        console.print(f"awm warmstart: {model} · {len(tasks)} tasks · {epochs} epochs -> {out}")
    from awm.fleet import FleetError

    try:
        demos = asyncio.run(replay())  # the fleet stops before training starts
        record = ws.fine_tune(demos, tasks, agent, model, out, cfg, chat_template, skipped, on_step)
    except (FleetError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        print(json.dumps({k: v for k, v in record.items() if k != "losses"} | {"losses": record["losses"]}))
    else:
        console.print(f"{len(record['demonstrations'])} demonstrations, {record['trained_tokens']} trained tokens, "
                      f"loss {record['losses'][0]:.4f} -> {record['losses'][-1]:.4f} in {record['seconds']} s: {out}")
        for name, why in record["skipped"].items():
            console.print(f"  skipped {name}: {why}")


@trainer_app.command("verify")
def verify_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory of awm train or awm eval (trajectories.jsonl).")],
    catalog: Annotated[Optional[str], typer.Option("--catalog", "-c", help=(
        "Catalog of the run's environments (default: the one in the run's config.json, else the starter).")
    )] = None,
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="Instances per environment.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    database_url: Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                                       help="External Postgres admin DSN (default: embedded).")] = None,
    judge_base_url: JudgeUrlOpt = None,
    judge_model: JudgeModelOpt = None,
    judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None,
) -> None:
    """Re-verify a saved run offline: replay each episode's tool calls on a fresh instance, verify
    with its final answer (code verifier or LLM judge), and compare with the live verdicts.
    Writes RUN_DIR/verify.jsonl; exits 1 when any verdict differs."""
    from awm import catalog as catalog_mod
    from awm.fleet import Database
    from awm.trainer.reverify import reverify, summary

    if not (run_dir / "trajectories.jsonl").is_file():
        err.print(f"[red]error:[/red] {run_dir} has no trajectories.jsonl")
        raise typer.Exit(2)
    config = run_dir / "config.json"
    if catalog is None and config.is_file():
        catalog = json.loads(config.read_text()).get("catalog")
    try:
        bundles = catalog_mod.load(catalog or "starter")
    except catalog_mod.CatalogError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, True)

    async def run() -> list[Any]:
        database = await asyncio.to_thread(Database.open, database_url)
        try:
            return await reverify(run_dir, bundles, replicas, database, serving)
        finally:
            await asyncio.to_thread(database.close)

    results = asyncio.run(run())
    totals = summary(results)
    if as_json:
        print(json.dumps(totals))
    else:
        table = Table(title=f"awm verify {run_dir}")
        for col in ("episodes", "replayed", "same verdict", "different", "diverged replays", "skipped"):
            table.add_column(col, justify="right")
        table.add_row(*(str(totals[k]) for k in ("episodes", "replayed", "same", "different", "diverged", "skipped")))
        console.print(table)
        for r in results:
            if not r.same and r.offline != "skipped":
                console.print(f"[red]{r.env}/{r.task_id}[/red] {r.episode_id[:8]}: {r.reason}")
    raise typer.Exit(1 if totals["different"] else 0)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _checkpoint_policy(path: Path, temperature: float, thinking: bool | None = None) -> Any:
    """A LocalPolicy from an `awm train` checkpoint, with the run's sampling settings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from awm.trainer import tiny
    from awm.trainer.local_policy import LocalPolicy, SamplingSpec

    from awm.trainer.models import resolve_device

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).to(resolve_device("auto"))
    config_file = path.parent.parent / "config.json"
    max_new, actions = 256, []
    if config_file.exists():
        policy_cfg = json.loads(config_file.read_text()).get("policy", {})
        max_new = policy_cfg.get("max_new_tokens", max_new)
        actions = (policy_cfg.get("tiny") or {}).get("actions", []) if policy_cfg.get("kind") == "tiny" else []
    return LocalPolicy(model, tokenizer, SamplingSpec(temperature, max_new, tiny.allowed_ids(tokenizer, actions)),
                       name=path.name, thinking=thinking)
