"""``awm operator``: render the CRDs, run the operator (registered by awm/cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml

operator_app = typer.Typer(help="The Kubernetes operator: CRDs and the operator process.", no_args_is_help=True)

HEADER = "# Generated from operator/awm_operator/crds.py (awm operator crds): do not edit.\n"


def render(crd: dict) -> str:  # type: ignore[type-arg]
    return HEADER + yaml.safe_dump(crd, sort_keys=False)


@operator_app.command("crds")
def crds(output: Annotated[Optional[Path], typer.Option("--output", "-o", help=(
        "Directory to write <plural>.<group>.yaml files into (default: print a YAML stream)."))] = None) -> None:
    """The CustomResourceDefinitions of EnvFleet and EnvClaim, from the pydantic models."""
    from awm_operator.crds import definitions

    if output is None:
        print("---\n".join(render(c) for c in definitions()), end="")
        return
    output.mkdir(parents=True, exist_ok=True)
    for crd in definitions():
        path = output / f"{crd['metadata']['name']}.yaml"
        path.write_text(render(crd))
        typer.echo(f"wrote {path}")


@operator_app.command("run")
def run() -> None:
    """Run the operator (configured by AWM_* environment variables; see docs/kubernetes.md)."""
    from awm_operator.main import run as run_operator

    run_operator()
