"""Prompts of the synthesis stages. Each system prompt starts with a ``[awm-stage: X]`` tag:
harmless to a real model, and how the test suite's scripted endpoint tells the stages apart."""

from __future__ import annotations

import json
from typing import Any

CONTRACT = """Runtime contract (PostgreSQL, Python 3.11):
- Tool code: one function per tool, `def <tool_name>(db, <arguments>)`. `db.query(sql, *params)`
  returns a list of dicts, `db.one(...)` a dict or None, `db.scalar(...)` one value,
  `db.execute(...)` the affected row count. Use %s placeholders, one statement per call, no
  transaction control. Raise `ToolError("message")` (already defined) for not-found ids and
  invalid requests. Return JSON-friendly dicts/lists. Only standard-library imports.
- The acting user is the one with id 1; there is no login.
- Verifier code: `def verify(final, initial, answer)` where `final` is the database after the
  episode, `initial` the untouched snapshot (read-only, same query/one/scalar API, unqualified
  table names), `answer` the agent's final message or None. Return (bool, "reason")."""


def system(stage: str, text: str) -> str:
    return f"[awm-stage: {stage}]\n{text.strip()}\n\nReply with one JSON object only."


SCENARIO = system("scenario", """
You invent realistic software applications that can be simulated with a relational database and
a set of API tools: everyday products people use (shops, booking, finance, productivity, health,
travel, education, ...). Each scenario has a snake_case `name`, a 80-150 word `description` of
its entities and user actions, and a short `category`.
JSON: {"scenarios": [{"name": str, "description": str, "category": str}]}""")


def scenario_user(count: int, examples: list[dict[str, Any]], avoid: list[str]) -> str:
    shots = "\n".join(f"- {e['name']}: {e['description'][:300]}" for e in examples)
    return (f"Examples of the kind of scenario wanted:\n{shots}\n\nDo not repeat these or anything close "
            f"to them: {', '.join(avoid[-60:])}.\nInvent {count} new, diverse scenarios.")


CLASSIFY = system("classify", """
You judge whether software scenarios can be simulated faithfully as a relational database plus
API tools (create, read, update, delete, search over stored entities), without real-world
side effects the database cannot hold (payments networks, hardware, live feeds, media
processing, physical delivery in progress). For each scenario give its categories, a
suitability score from 1 (cannot be simulated) to 10 (pure CRUD over clear entities), the level
(high >= 8, medium 5-7, low <= 4), one sentence of reasoning, and the features that can and
cannot be simulated.
JSON: {"classifications": [{"name": str, "categories": [str], "suitability_score": int,
"suitability_level": "high"|"medium"|"low", "reasoning": str, "simulatable_features": [str],
"non_simulatable_features": [str]}]}""")


def classify_user(scenarios: list[dict[str, Any]]) -> str:
    return "Scenarios:\n" + "\n".join(f"- {s['name']}: {s['description'][:600]}" for s in scenarios)


TASK = system("task", f"""
You write tasks for an AI agent that operates an application through API tools. Each task is one
specific request from the user (who is logged in as user id 1), naming every value it needs,
solvable with a few tool calls, and checkable from the database afterwards (a change to make) or
from the agent's answer (a question about the data). No login, signup, download or UI tasks.
Mix easy and harder tasks. JSON: {{"tasks": [str]}}
{CONTRACT}""")


def task_user(name: str, description: str, count: int) -> str:
    return f"Scenario {name}: {description}\n\nWrite {count} tasks."


DB = system("db", """
You design the PostgreSQL schema of an application: 5-15 tables with BIGSERIAL primary keys
named id, foreign keys, NOT NULL, CHECK and UNIQUE constraints where the domain wants them,
timestamps as TIMESTAMPTZ, money as NUMERIC(12,2). No authentication tables beyond a users table.
The schema must support every task given. JSON: {"ddl": "<PostgreSQL DDL script>"}""")


def db_user(name: str, description: str, tasks: list[str]) -> str:
    return f"Scenario {name}: {description}\n\nTasks it must support:\n" + "\n".join(f"- {t}" for t in tasks)


SAMPLE = system("sample", """
You write realistic seed data for a PostgreSQL schema: every table gets rows, parents before
children, explicit ids starting at 1, user id 1 is the acting user, fixed dates in 2026 (never
now()). The data must make every task possible (the entities a task names exist) but no task may
already be done. JSON: {"tables": [{"table": str, "rows": [{column: value}]}]}""")


def sample_user(name: str, description: str, ddl: str, tasks: list[str]) -> str:
    return (f"Scenario {name}: {description}\n\nSchema:\n{ddl}\n\nTasks the data must make possible:\n"
            + "\n".join(f"- {t}" for t in tasks))


SPEC = system("spec", """
You design the tool interface (API) of an application for an AI agent: 10-30 atomic tools
(search/list with filters, get by id, create, update, cancel, ...) that together can do every
task, acting as user 1. Each tool: snake_case `name`, one-line `description`, `input_schema`
(JSON Schema, type object, properties with descriptions, required list, additionalProperties
false) and `example_arguments` valid for the seed data. JSON: {"tools": [{"name": str,
"description": str, "input_schema": {...}, "example_arguments": {...}}]}""")


def spec_user(name: str, description: str, ddl: str, tasks: list[str]) -> str:
    return db_user(name, description, tasks) + f"\n\nSchema:\n{ddl}"


ENV = system("env", f"""
You implement the tools of an application in Python against its PostgreSQL database.
{CONTRACT}
JSON: {{"prelude": "<shared imports, constants, private helpers>", "tools": [{{"name": str,
"code": "<def name(db, ...): ...>"}}]}} with exactly the tools of the spec, keyword arguments
named as in each input_schema (optional ones with defaults).""")


def env_user(name: str, ddl: str, tools: list[dict[str, Any]]) -> str:
    spec = json.dumps([{k: t[k] for k in ("name", "description", "input_schema")} for t in tools], indent=1)
    return f"Scenario {name}.\n\nSchema:\n{ddl}\n\nTools to implement:\n{spec}"


VERIFIER = system("verifier", f"""
You write the verifier of one task: Python code that decides from the database (and the agent's
answer, for questions) whether the task was completed. It must return False on the untouched
database and True only when the specific requested change or answer is there; compare with
`initial` where useful; never depend on the current time.
{CONTRACT}
JSON: {{"code": "<def verify(final, initial, answer): ...>"}}""")


VERIFIER_JUDGE = system("verifier", f"""
You write the evidence gatherer of one task, for an LLM judge (the reference system's "sql"
mode): Python code that reads the database before (`initial`) and after (`final`) the episode
and returns a JSON-serialisable dict of exactly the rows and values a judge needs to decide
whether the task was done - the rows the task should have changed, before and after, and for
questions the values the answer must contain. It decides nothing itself; never depend on the
current time. Also state what a completed episode shows (success_criteria) and what an
incomplete one shows (failure_criteria), concretely, for the judge.
{CONTRACT}
JSON: {{"code": "<def verify(final, initial, answer): ... return {{...}}>", "success_criteria": str,
"failure_criteria": str}}""")


def verifier_user(name: str, ddl: str, seed_excerpt: str, task: str) -> str:
    return f"Scenario {name}.\n\nSchema:\n{ddl}\n\nSeed data (excerpt):\n{seed_excerpt}\n\nTask: {task}"


SOLUTION = system("solution", """
You solve a task by planning the exact tool calls an ideal agent makes, in order, with concrete
argument values from the seed data (ids of rows created during the solution continue after the
highest seeded id). For questions, also give the `final_answer` the agent should reply with.
JSON: {"steps": [{"tool": str, "arguments": {...}}], "final_answer": str | null}""")


def solution_user(name: str, tools: list[dict[str, Any]], seed_excerpt: str, task: str) -> str:
    spec = json.dumps([{k: t[k] for k in ("name", "description", "input_schema")} for t in tools], indent=1)
    return f"Scenario {name}.\n\nTools:\n{spec}\n\nSeed data (excerpt):\n{seed_excerpt}\n\nTask: {task}"


SUMMARY = system("summary", """
You are a debugging expert. Below are the errors that executing a generated artifact produced
(SQL, seed rows, Python tool or verifier code, or a tool-call plan). Summarise them into short,
concrete guidance for the next attempt: what failed, why, and exactly what to change. Keep every
identifier, table, column and value that matters; drop repetition and stack noise.
JSON: {"guidance": str}""")


def summary_user(errors: list[str]) -> str:
    return "Errors:\n" + "\n".join(f"- {e}" for e in errors)


def feedback(errors: list[str]) -> str:
    listed = "\n".join(f"- {e}" for e in errors[:20])
    return f"\n\nYour previous answer was executed and failed:\n{listed}\nFix every one of these problems."
