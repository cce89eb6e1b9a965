"""``awm warmstart``: a supervised warm start on the catalog's reference solutions (trainer/warmstart.py).

Exit codes: 0 the model was written, 2 bad input (the catalog, the output directory, no task with
a reference solution) or a fleet that cannot start.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from awm.serveopts import UngatedOpt
from awm.trainer.cmd_options import (DatabaseUrlOpt, DescriptionsOpt, FormatOpt, ToolDescriptions, ToolFormat,
                                     console, err)


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
    database_url: DatabaseUrlOpt = None,
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
        _show_record(record, out)


def _show_record(record: dict[str, Any], out: Path) -> None:
    """What the warm start did, in a line, and each task left out with the reason."""
    console.print(f"{len(record['demonstrations'])} demonstrations, {record['trained_tokens']} trained tokens, "
                  f"loss {record['losses'][0]:.4f} -> {record['losses'][-1]:.4f} in {record['seconds']} s: {out}")
    for name, why in record["skipped"].items():
        console.print(f"  skipped {name}: {why}")
