"""``awm eval``: pass@1 and pass@k per environment for a model endpoint or a checkpoint of ``awm
train``; with ``--suite``, an out-of-distribution benchmark's own harness instead.

The command goes in steps, a function each: read the flags (and a training config's evaluation
settings), select the tasks, build the policy, run the episodes on a fleet, then write eval.json,
eval.png and trajectories.jsonl and print the table. Heavy imports (transformers and torch for
``--checkpoint``, matplotlib for the plot) stay inside the steps that need them.

Exit codes: 0 the report was written, 2 bad input or a fleet that cannot start, 3 the policy or the
environment instances are unavailable (a partial eval.json is kept); ``--suite``: 1 when its
harness fails.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from awm.serveopts import JudgeModelOpt, JudgeUrlOpt, JudgeVotesOpt, KindOpt, UngatedOpt, serving_options
from awm.trainer.cmd_options import (ApiKeyOpt, BaseUrlOpt, DatabaseUrlOpt, DescriptionsOpt, FormatOpt, MaxTokOpt,
                                     MaxTurnsOpt, ModelOpt, StopFormatOpt, TempOpt, ThinkingOpt, ToolDescriptions,
                                     ToolFormat, WindowOpt, console, err, load_bundles, policy_endpoint,
                                     thinking_body)


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
    database_url: DatabaseUrlOpt = None,
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
    flags = _Decoding(temperature, max_tokens, max_turns, history_window, tool_format, thinking,
                      stop_on_format_error, extra_body)
    decoding = _with_config(ctx, config, flags)
    if suite is not None:
        _suite(suite, base_url, model, api_key, decoding.temperature, out, suite_python, category, case, num_tasks,
               k, user_base_url, user_model, benchmark_config, max_steps)
        return
    bundles = load_bundles(catalog, env or None)
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, allow_ungated)
    tasks = _select_tasks(bundles, task, allow_ungated, verifier_kind)
    policy, name, evaluated = _build_policy(checkpoint, base_url, model, api_key, decoding, request_timeout, retries)
    agent_cfg = decoding.agent_config(tool_descriptions)
    out.mkdir(parents=True, exist_ok=True)
    run = _Evaluation(name, k, out, tasks, evaluated, as_json,
                      _run_settings(decoding, tool_descriptions, verifier_kind, catalog, len(tasks), config))
    scores = _evaluate(run, bundles, policy, agent_cfg, replicas, instances, database_url, serving)
    data = _write_report(run, scores)
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        _show_report(data, run)


@dataclass
class _Decoding:
    """The settings a training config's ``evaluation`` may pin (where no flag was given): how the
    policy samples and how the agent runs an episode. Two evaluations are comparable only if
    these agree, so eval.json records them."""

    temperature: float
    max_tokens: int
    max_turns: int
    history_window: int | None
    tool_format: ToolFormat
    thinking: bool | None
    stop_on_format_error: bool
    extra_body: str | None  # JSON, as --extra-body gives it (with the config's top-p and top-k merged in)
    require_thinking: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)  # the config's top-p and top-k

    def agent_config(self, tool_descriptions: ToolDescriptions) -> Any:
        """The agent loop's settings for every episode of the evaluation."""
        from awm.trainer.agent import AgentConfig

        return AgentConfig(max_turns=self.max_turns, history_window=self.history_window,
                           tool_format=self.tool_format.value, stop_on_format_error=self.stop_on_format_error,
                           tool_descriptions=tool_descriptions.value, require_thinking=self.require_thinking)


def _with_config(ctx: typer.Context, config: Path | None, flags: _Decoding) -> _Decoding:
    """The flags' settings, with a training config's evaluation settings where no flag says
    otherwise: the paper pins decoding apart from training, and ``--config`` reproduces that. A
    config that does not load exits 2."""
    if config is None:
        return flags
    try:
        pinned = _evaluation_defaults(config, _given_flags(ctx))
    except (OSError, ValueError) as exc:
        err.print(f"[red]error:[/red] --config {config}: {exc}")
        raise typer.Exit(2) from exc
    require_thinking = bool(pinned.pop("require_thinking", False))
    sampling = pinned.pop("sampling", None) or {}
    if "tool_format" in pinned:
        pinned["tool_format"] = ToolFormat(pinned["tool_format"])
    extra_body = flags.extra_body
    if sampling:  # top-p and top-k, in every request's body (vLLM and OpenAI-style servers)
        extra_body = json.dumps({**sampling, **(json.loads(extra_body) if extra_body else {})})
    return replace(flags, **pinned, extra_body=extra_body, require_thinking=require_thinking, sampling=sampling)


def _given_flags(ctx: typer.Context) -> set[str]:
    """The parameters the command line (or an environment variable) set: a config's value yields
    to them."""
    # (by name: typer ships its own click, whose ParameterSource is not click's)
    return {name for name in ctx.params
            if getattr(ctx.get_parameter_source(name), "name", "") not in ("DEFAULT", "DEFAULT_MAP")}


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


def _select_tasks(bundles: list[Any], task: list[str] | None, allow_ungated: bool,
                  verifier_kind: str | None) -> list[Any]:
    """The tasks to evaluate; none selected exits 2 (rather than writing an empty report), saying
    that the gates are usually why."""
    from awm.trainer import eval as ev

    tasks = ev.select_tasks(bundles, task, allow_ungated, verifier_kind)
    if not tasks:
        err.print("[red]error:[/red] no tasks selected (only tasks that passed both gates are evaluated unless "
                  "--allow-ungated; `awm catalog validate --record` records the gates)")
        raise typer.Exit(2)
    return tasks


def _build_policy(checkpoint: Path | None, base_url: str | None, model: str | None, api_key: str | None,
                  decoding: _Decoding, request_timeout: float, retries: int) -> tuple[Any, str, dict[str, Any] | None]:
    """The policy to evaluate, its name in the report and, for a checkpoint, where it comes from
    (so a run's page can draw pass@1 over its checkpoints): a local checkpoint of ``awm train``
    if given, else the OpenAI-compatible endpoint. No endpoint, or a bad --extra-body, exits 2."""
    from awm.trainer import eval as ev
    from awm.trainer.policy import OpenAIPolicy

    if checkpoint is not None:
        if checkpoint.is_file() and checkpoint.name == "latest":  # RUN/checkpoints/latest names the step
            checkpoint = checkpoint.parent / checkpoint.read_text().strip()
        policy = _checkpoint_policy(checkpoint, decoding.temperature, decoding.thinking)
        return policy, str(checkpoint), ev.checkpoint_of(checkpoint)
    url, name = policy_endpoint(base_url, model)
    extra = _extra_body(decoding.extra_body)
    policy = OpenAIPolicy(url, name, api_key or "", temperature=decoding.temperature, max_tokens=decoding.max_tokens,
                          timeout_s=request_timeout, retries=retries,
                          extra_body=thinking_body(decoding.thinking, extra))
    return policy, name, None


def _extra_body(text: str | None) -> dict[str, Any]:
    """--extra-body as the JSON object merged into every request; anything else exits 2."""
    try:
        extra = json.loads(text) if text else {}
        if not isinstance(extra, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        err.print(f"[red]error:[/red] --extra-body: {exc}")
        raise typer.Exit(2) from exc
    return extra


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


def _run_settings(decoding: _Decoding, tool_descriptions: ToolDescriptions, verifier_kind: str | None,
                  catalog: str, tasks_selected: int, config: Path | None) -> dict[str, Any]:
    """What produced the numbers, for the report: two evaluations are comparable only if these agree."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "temperature": decoding.temperature, "max_tokens": decoding.max_tokens, "max_turns": decoding.max_turns,
            "history_window": decoding.history_window, "tool_format": decoding.tool_format.value,
            "tool_descriptions": tool_descriptions.value, "thinking": decoding.thinking,
            "verifier_kind": verifier_kind, "catalog": str(catalog), "tasks_selected": tasks_selected,
            **({"config": str(config), **decoding.sampling} if config is not None else {})}


@dataclass
class _Evaluation:
    """One evaluation as it runs: what its report is made of, and the tasks finished so far, kept
    so that a partial report can still be written when the policy or the instances go away."""

    name: str
    k: int
    out: Path
    tasks: list[Any]
    evaluated: dict[str, Any] | None
    as_json: bool
    settings: dict[str, Any]
    done: list[Any] = field(default_factory=list)
    reporter: Any = None  # inside a campaign's Job: posts the progress to the operator

    def on_task(self, score: Any) -> None:
        """A task's k samples are scored: print it, and tell the campaign (if any) how far we are."""
        from awm.trainer import eval as ev

        if not self.as_json:
            console.print(f"  {score.env}/{score.task_id}: {score.complete}/{score.samples} complete"
                          f"{f', {score.masked} masked' if score.masked else ''}")
        self.done.append(score)
        if self.reporter is not None:
            self.reporter.report(**ev.running_summary(self.done))

    def report(self, scores: list[Any]) -> dict[str, Any]:
        """eval.json's content, for the scores per environment."""
        from awm.trainer import eval as ev

        return ev.report(scores, self.k, self.name, self.settings, self.evaluated)


def _evaluate(run: _Evaluation, bundles: list[Any], policy: Any, agent_cfg: Any, replicas: int,
              instances: int | None, database_url: str | None, serving: dict[str, Any]) -> list[Any]:
    """Every task k times on a fleet (a local one, or inside a campaign's Job the campaign's), the
    scores per environment. A fleet that cannot start exits 2; when the policy or the instances go
    away, what finished is kept as a partial eval.json, marked as such, and the command exits 3."""
    from awm.episode.allocation import OperatorSettings
    from awm.fleet import FleetError
    from awm.trainer.k8s_source import ProgressReporter
    from awm.trainer.policy import PolicyUnavailable
    from awm.trainer.rollout import InstancesUnavailable

    k8s = OperatorSettings.from_env()  # inside a campaign's Job: the campaign's fleet
    run.reporter = ProgressReporter(k8s) if k8s is not None and k8s.campaign else None
    if not run.as_json:
        console.print(f"awm eval: {run.name} · {len(run.tasks)} tasks × k={run.k} · {len(bundles)} environments")
    fleet = {"database_url": database_url, "settings": k8s, "instances": instances, **serving}
    try:
        return asyncio.run(_episodes(run, bundles, policy, agent_cfg, replicas, fleet))
    except FleetError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    except (PolicyUnavailable, InstancesUnavailable) as exc:
        _write_partial_report(run, "policy" if isinstance(exc, PolicyUnavailable) else "instances", exc)
        raise typer.Exit(3) from exc


async def _episodes(run: _Evaluation, bundles: list[Any], policy: Any, agent_cfg: Any, replicas: int,
                    fleet: dict[str, Any]) -> list[Any]:
    """The episodes themselves, each written to trajectories.jsonl as it ends; the policy, the log
    and the progress reporter are closed however the evaluation ends."""
    from awm.episode.reward import RewardConfig
    from awm.episode.sources import run_source
    from awm.trainer import eval as ev
    from awm.trainer.trajectory import TrajectoryLog

    log = TrajectoryLog(run.out / "trajectories.jsonl")
    try:
        async with run_source(bundles, replicas, run.k, **fleet) as source:
            return await ev.evaluate(source, policy, run.tasks, run.k, agent_cfg, RewardConfig(), log, run.on_task)
    finally:
        await policy.close()
        log.close()
        if run.reporter is not None:
            await run.reporter.aclose()


def _write_partial_report(run: _Evaluation, what: str, exc: BaseException) -> None:
    """The tasks that finished before the policy or the instances went away, as eval.json next to
    their trajectories, marked incomplete; and what happened, on stderr."""
    from awm.trainer import eval as ev

    partial = {**run.report(ev.by_environment(run.done)), "incomplete": f"{what} unavailable: {exc}",
               "tasks_selected": len(run.tasks)}
    (run.out / "eval.json").write_text(json.dumps(partial, indent=2))
    err.print(f"[red]error: the {'policy endpoint is' if what == 'policy' else 'environment instances are'} "
              f"unavailable:[/red] {exc}")
    err.print(f"{len(run.done)} of {len(run.tasks)} tasks finished before that: partial report in "
              f"{run.out / 'eval.json'}")


def _write_report(run: _Evaluation, scores: list[Any]) -> dict[str, Any]:
    """eval.json and its plot eval.png; the report, for the table or --json."""
    from awm.trainer import eval as ev

    data = run.report(scores)
    (run.out / "eval.json").write_text(json.dumps(data, indent=2))
    ev.plot(data, run.out / "eval.png")
    return data


def _show_report(data: dict[str, Any], run: _Evaluation) -> None:
    """pass@1 and pass@k per environment and overall as a table (one pass column when k is 1),
    a note on the tasks that kept fewer than k scored samples, and the files written."""
    k = run.k
    table = Table(title=f"awm eval: {run.name}, k={k}")
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
    out = run.out
    console.print(f"wrote {out / 'eval.json'}, {out / 'eval.png'}, {out / 'trajectories.jsonl'}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _suite(suite: str, base_url: str | None, model: str | None, api_key: str | None, temperature: float, out: Path,
           python: str | None, categories: list[str] | None, cases: list[str] | None, num_tasks: int | None,
           trials: int, user_base_url: str | None, user_model: str | None, configs: list[str] | None,
           max_steps: int = 100) -> None:
    """``--suite``: a published benchmark's own harness and evaluator (trainer/suites/), with the
    policy's endpoint (and tau2's user simulator). An unknown suite or bad input exits 2, a
    harness that fails exits 1."""
    from awm.trainer.suites.proc import HarnessError
    from awm.trainer.suites.run import SUITES, run_suite
    from awm.trainer.suites.table import Endpoint

    if suite not in SUITES:
        err.print(f"[red]error:[/red] --suite {suite!r}: one of {', '.join(SUITES)}")
        raise typer.Exit(2)
    url, name = policy_endpoint(base_url, model)
    key = api_key or os.environ.get("OPENAI_API_KEY", "")
    policy = Endpoint(url, name, key, temperature)
    user = Endpoint(user_base_url or url, user_model or name, key, temperature)
    try:
        run_suite(suite, policy, out, console, python=python, categories=categories, cases=cases,
                  num_tasks=num_tasks, trials=trials, user=user, configs=configs, max_steps=max_steps)
    except (ValueError, HarnessError, RuntimeError) as exc:  # bad input: 2; the harness failed: 1
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2 if isinstance(exc, ValueError) else 1) from exc
