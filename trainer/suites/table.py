"""The suites' common report: one row per benchmark category with the benchmark's own metric(s),
summary rows shaped like the AWM paper's Table 4, what was skipped and why; printed as a table and
written as JSON. Values are fractions in [0, 1] (printed as percentages) or None where the
benchmark reported nothing for that cell."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass
class Endpoint:
    """An OpenAI-compatible endpoint: what every suite's harness is pointed at."""

    base_url: str
    model: str
    api_key: str = ""
    temperature: float = 0.0


@dataclass
class Row:
    category: str
    cases: int
    metrics: dict[str, float | None]


@dataclass
class SuiteReport:
    suite: str
    harness: str  # the benchmark's package and version, or repository and commit
    model: str
    metrics: list[str]  # column names, in order
    rows: list[Row]
    summary: list[Row] = field(default_factory=list)  # the paper's rows (Overall, Hallucination, ...)
    skipped: dict[str, str] = field(default_factory=dict)  # category -> why it did not run
    details: dict[str, Any] = field(default_factory=dict)  # per-case results, as the benchmark gave them

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{self.suite}.json"
        path.write_text(json.dumps(self.to_json(), indent=2))
        return path


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def render(report: SuiteReport, console: Console) -> None:
    table = Table(title=f"awm eval --suite {report.suite}: {report.model} ({report.harness})")
    table.add_column("category")
    table.add_column("cases", justify="right")
    for name in report.metrics:
        table.add_column(name, justify="right")
    for row in report.rows:
        table.add_row(row.category, str(row.cases), *(_cell(row.metrics.get(m)) for m in report.metrics))
    if report.summary:
        table.add_section()
        for row in report.summary:
            table.add_row(row.category, str(row.cases), *(_cell(row.metrics.get(m)) for m in report.metrics))
    console.print(table)
    for category, why in report.skipped.items():
        console.print(f"skipped {category}: {why}")
