"""The LLM judge's cost per verdict, and what judging adds to /verify.

    python -m bench.judge [--episodes 30] [--json]

* Prompt size per verdict for episodes of 1 to 200 tool calls (results of 400 characters, a
  realistic evidence dict): characters, and tokens estimated at 4 characters per token (the
  judge model's tokenizer is not known here; a real model's count is within tens of percent).
  The budget caps it: long episodes cost no more than ``max_trajectory_tokens`` + evidence +
  instructions.
* /verify latency on a served instance of the notes fixture, in the same run: a code verifier,
  a judge verifier answered by a local OpenAI-compatible endpoint that replies at once (so the
  number is awm's own overhead: evidence in the worker, prompt, HTTP, parse), and a cache hit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any


from awm.authoring import compile_source_dir
from awm.bundle import Task, Verifier
from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from awm.judge import CHARS_PER_TOKEN, JudgeSettings, Step, build_messages
from tests.llm_server import Reply, ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = '''
def evidence(final, initial, answer):
    return {"notes_after": final.query("SELECT id, title, body, archived FROM notes ORDER BY id"),
            "notes_before": initial.query("SELECT id, title, body, archived FROM notes ORDER BY id")}
'''


def prompt_sizes() -> list[dict[str, Any]]:
    settings = JudgeSettings(base_url="http://unused", model="m")
    evidence = {"rows_before": [{"id": i, "title": f"item {i}", "price": 9.5 + i} for i in range(10)],
                "rows_after": [{"id": i, "title": f"item {i}", "price": 9.5 + i} for i in range(11)]}
    out = []
    for n in (1, 10, 50, 200):
        steps = [Step(tool=f"tool_{i % 5}", arguments={"id": i, "query": "wireless headphones"},
                      result=json.dumps({"items": [{"id": j, "name": f"product {j}"} for j in range(12)]})[:400])
                 for i in range(n)]
        messages, cut = build_messages("Add the cheapest pair of wireless headphones to my cart.",
                                       "The cart holds the cheapest headphones.", "Anything else.",
                                       evidence, steps, "Done.", settings)
        chars = sum(len(m["content"]) for m in messages)
        out.append({"tool_calls": n, "prompt_chars": chars, "prompt_tokens_est": chars // CHARS_PER_TOKEN,
                    "steps_omitted": len(cut["steps_omitted"]), "output_tokens_max": settings.max_output_tokens})
    return out


async def verify_latency(episodes: int) -> dict[str, Any]:
    notes = compile_source_dir(ROOT / "tests" / "fixtures" / "notes")
    judge_task = Task(id="judged", instruction='Add a note titled "groceries".', solution=[],
                      verifier=Verifier(kind="judge", code=EVIDENCE, entrypoint="evidence"))
    bundle = notes.model_copy(update={"tasks": [notes.task("add_note"), judge_task]})
    reply = Reply.json({"reasoning": "the note exists", "classification": "complete"})
    database = Database.open()
    result: dict[str, Any] = {}
    try:
        with ScriptedLLM(lambda stage, body, index: reply) as llm:
            settings = JudgeSettings(base_url=llm.base_url, model="local")
            async with LocalFleet([bundle], database=database, judge=settings, allow_ungated=True) as fleet:
                control = ControlClient(fleet.instances[0].control_url)
                async with McpSession(fleet.instances[0].mcp_url) as mcp:
                    for label, task in (("code_verifier", "add_note"), ("judge", "judged"), ("judge_cache_hit", None)):
                        times = []
                        for i in range(episodes):
                            await control.reset(task or "judged")
                            title = "groceries" if task is None else f"groceries {i}"  # new state: no cache
                            await mcp.call_tool("add_note", {"title": title, "body": "milk"})
                            t0 = time.perf_counter()
                            await control.verify("done")
                            times.append((time.perf_counter() - t0) * 1000)
                        result[label] = {"p50_ms": round(statistics.median(times), 2),
                                         "max_ms": round(max(times), 2)}
                await control.close()
    finally:
        database.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version()},
           "prompt_per_verdict": prompt_sizes(), "verify_latency": asyncio.run(verify_latency(args.episodes))}
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
