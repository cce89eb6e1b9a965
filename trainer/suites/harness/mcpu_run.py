"""Runs inside the MCP-Universe virtualenv (mcpuniverse installed; never imported by awm): loads
each MCP-Universe benchmark YAML, points its ``llm`` components at the endpoint (mcpuniverse's own
OpenAI model class with ``base_url``), runs mcpuniverse's ``BenchmarkRunner`` (its agent, its MCP
servers, its evaluators) and writes every task's evaluator verdicts to ``--out`` as JSON.

    python mcpu_run.py --out FILE --model M --base-url URL CONFIG.yaml [...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

import yaml


def _pointed(config: Path, model: str, base_url: str, api_key: str, workdir: Path) -> Path:
    """The config with every llm component swapped for mcpuniverse's OpenAI class at the endpoint;
    task paths made absolute (the runner resolves relative ones against its own package)."""
    docs = [dict(d) for d in yaml.safe_load_all(config.read_text()) if d]
    for doc in docs:
        if str(doc.get("kind", "")).lower() == "llm":
            doc["spec"]["type"] = "openai"
            doc["spec"]["config"] = {"model_name": model, "base_url": base_url, "api_key": api_key}
        if str(doc.get("kind", "")).lower() == "benchmark":
            doc["spec"]["tasks"] = [t if Path(t).is_absolute() or not (config.parent / t).exists()
                                    else str((config.parent / t).resolve()) for t in doc["spec"]["tasks"]]
    out = workdir / config.name
    out.write_text(yaml.safe_dump_all(docs))
    return out


async def _run(configs: list[Path], model: str, base_url: str, api_key: str) -> dict:
    from mcpuniverse.benchmark.runner import BenchmarkRunner
    from mcpuniverse.tracer.collectors import MemoryCollector

    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in configs:
            runner = BenchmarkRunner(str(_pointed(config, model, base_url, api_key, Path(tmp))))
            outputs = await runner.run(trace_collector=MemoryCollector())
            tasks = {}
            for output in outputs:
                for task, res in output.task_results.items():
                    verdicts = res["evaluation_results"]
                    tasks[task] = {"passed": bool(verdicts) and all(v.passed for v in verdicts),
                                   "evaluators": [{"passed": v.passed, "reason": v.reason, "error": v.error}
                                                  for v in verdicts]}
            results[config.stem] = tasks
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("configs", nargs="+")
    a = p.parse_args()
    key = os.environ.get("OPENAI_API_KEY") or "EMPTY"
    results = asyncio.run(_run([Path(c).resolve() for c in a.configs], a.model, a.base_url, key))
    Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
