"""What the scripted LLM answers in the synthesis tests: good answers for two small scenarios
(``library`` and ``todo``), and the broken answers that make every repair path run first."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.llm_server import Reply, scenario_of, user_text

SCENARIOS = [
    {"name": "library", "description": "A public library: members borrow and return books.", "category": "education"},
    {"name": "todo", "description": "A to-do app: lists of items that can be added and completed.",
     "category": "productivity"},
]

TASKS = {
    "library": ["Borrow the book 'Dune'.", "How many books are available to borrow right now?"],
    "todo": ["Add 'pay rent' to my Home list.", "Mark the item 'buy milk' as done."],
}

DDL = {
    "library": """
CREATE TABLE members (id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE books (id BIGSERIAL PRIMARY KEY, title TEXT NOT NULL, available BOOLEAN NOT NULL DEFAULT true);
CREATE TABLE loans (id BIGSERIAL PRIMARY KEY, book_id BIGINT NOT NULL REFERENCES books(id),
  member_id BIGINT NOT NULL REFERENCES members(id), returned BOOLEAN NOT NULL DEFAULT false);
""",
    "todo": """
CREATE TABLE lists (id BIGSERIAL PRIMARY KEY, owner_id BIGINT NOT NULL, name TEXT NOT NULL);
CREATE TABLE items (id BIGSERIAL PRIMARY KEY, list_id BIGINT NOT NULL REFERENCES lists(id),
  title TEXT NOT NULL, done BOOLEAN NOT NULL DEFAULT false);
""",
}

SEED = {
    "library": [
        {"table": "members", "rows": [{"id": 1, "name": "Ada"}, {"id": 2, "name": "Bob"}]},
        {"table": "books", "rows": [{"id": 1, "title": "Dune", "available": True},
                                    {"id": 2, "title": "Emma", "available": True},
                                    {"id": 3, "title": "Ulysses", "available": False}]},
        {"table": "loans", "rows": [{"id": 1, "book_id": 3, "member_id": 2, "returned": False}]},
    ],
    "todo": [
        {"table": "lists", "rows": [{"id": 1, "owner_id": 1, "name": "Home"}, {"id": 2, "owner_id": 1, "name": "Work"}]},
        {"table": "items", "rows": [{"id": 1, "list_id": 1, "title": "buy milk", "done": False},
                                    {"id": 2, "list_id": 2, "title": "send report", "done": True}]},
    ],
}


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


SPEC = {
    "library": [
        {"name": "search_books", "description": "Search books by title.",
         "input_schema": _obj({"query": {"type": "string", "description": "Part of a title."}}, []),
         "example_arguments": {"query": "Du"}},
        {"name": "borrow_book", "description": "Borrow an available book as the current member.",
         "input_schema": _obj({"book_id": {"type": "integer"}}, ["book_id"]), "example_arguments": {"book_id": 2}},
        {"name": "return_book", "description": "Return a borrowed book.",
         "input_schema": _obj({"loan_id": {"type": "integer"}}, ["loan_id"]), "example_arguments": {"loan_id": 1}},
    ],
    "todo": [
        {"name": "list_items", "description": "Items of one of my lists.",
         "input_schema": _obj({"list_name": {"type": "string"}}, ["list_name"]), "example_arguments": {"list_name": "Home"}},
        {"name": "add_item", "description": "Add an item to one of my lists.",
         "input_schema": _obj({"list_name": {"type": "string"}, "title": {"type": "string"}}, ["list_name", "title"]),
         "example_arguments": {"list_name": "Work", "title": "plan sprint"}},
        {"name": "complete_item", "description": "Mark an item done.",
         "input_schema": _obj({"item_id": {"type": "integer"}}, ["item_id"]), "example_arguments": {"item_id": 1}},
    ],
}

ENV = {
    "library": {"prelude": "MEMBER = 1", "tools": [
        {"name": "search_books", "code": (
            "def search_books(db, query=''):\n"
            "    return db.query(\"SELECT id, title, available FROM books WHERE title ILIKE %s ORDER BY id\", f'%{query}%')\n")},
        {"name": "borrow_book", "code": (
            "def borrow_book(db, book_id):\n"
            "    book = db.one('SELECT available FROM books WHERE id = %s', book_id)\n"
            "    if book is None:\n        raise ToolError(f'book {book_id} not found')\n"
            "    if not book['available']:\n        raise ToolError('book is on loan')\n"
            "    db.execute('UPDATE books SET available = false WHERE id = %s', book_id)\n"
            "    return db.one('INSERT INTO loans (book_id, member_id) VALUES (%s, %s) RETURNING id', book_id, MEMBER)\n")},
        {"name": "return_book", "code": (
            "def return_book(db, loan_id):\n"
            "    loan = db.one('SELECT book_id FROM loans WHERE id = %s AND NOT returned', loan_id)\n"
            "    if loan is None:\n        raise ToolError('no such open loan')\n"
            "    db.execute('UPDATE loans SET returned = true WHERE id = %s', loan_id)\n"
            "    db.execute('UPDATE books SET available = true WHERE id = %s', loan['book_id'])\n"
            "    return {'returned': loan_id}\n")},
    ]},
    "todo": {"prelude": "OWNER = 1\n\ndef _list_id(db, name):\n    row = db.one('SELECT id FROM lists WHERE owner_id = %s AND name = %s', OWNER, name)\n    if row is None:\n        raise ToolError(f'no list {name!r}')\n    return row['id']", "tools": [
        {"name": "list_items", "code": (
            "def list_items(db, list_name):\n"
            "    return db.query('SELECT id, title, done FROM items WHERE list_id = %s ORDER BY id', _list_id(db, list_name))\n")},
        {"name": "add_item", "code": (
            "def add_item(db, list_name, title):\n"
            "    return db.one('INSERT INTO items (list_id, title) VALUES (%s, %s) RETURNING id', _list_id(db, list_name), title)\n")},
        {"name": "complete_item", "code": (
            "def complete_item(db, item_id):\n"
            "    if db.execute('UPDATE items SET done = true WHERE id = %s', item_id) == 0:\n"
            "        raise ToolError(f'item {item_id} not found')\n"
            "    return {'done': item_id}\n")},
    ]},
}

VERIFIERS = {
    ("library", 0): (
        "def verify(final, initial, answer):\n"
        "    n = final.scalar('SELECT count(*) FROM loans WHERE book_id = 1 AND member_id = 1 AND NOT returned')\n"
        "    return n == 1, f'{n} open loans of Dune by member 1'\n"),
    ("library", 1): (
        "import re\n\ndef verify(final, initial, answer):\n"
        "    n = initial.scalar('SELECT count(*) FROM books WHERE available')\n"
        "    found = re.findall(r'\\d+', answer or '')\n"
        "    return str(n) in found, f'expected {n} in the answer'\n"),
    ("todo", 0): (
        "def verify(final, initial, answer):\n"
        "    n = final.scalar(\"SELECT count(*) FROM items WHERE list_id = 1 AND title = 'pay rent' AND NOT done\")\n"
        "    return n == 1, f'{n} pay-rent items on Home'\n"),
    ("todo", 1): (
        "def verify(final, initial, answer):\n"
        "    done = final.scalar(\"SELECT done FROM items WHERE title = 'buy milk'\")\n"
        "    return bool(done), f'buy milk done={done}'\n"),
}

# Judge mode: evidence gatherers (the judge below decides from what they return).
EVIDENCE = {
    ("library", 0): "def verify(final, initial, answer):\n"
                    "    return {'open_dune_loans_of_member_1': final.scalar("
                    "'SELECT count(*) FROM loans WHERE book_id = 1 AND member_id = 1 AND NOT returned')}\n",
    ("library", 1): "def verify(final, initial, answer):\n"
                    "    return {'expected_in_answer': initial.scalar('SELECT count(*) FROM books WHERE available')}\n",
    ("todo", 0): "def verify(final, initial, answer):\n"
                 "    return {'pay_rent_items_on_home': final.scalar("
                 "\"SELECT count(*) FROM items WHERE list_id = 1 AND title = 'pay rent' AND NOT done\")}\n",
    ("todo", 1): "def verify(final, initial, answer):\n"
                 "    return {'buy_milk_done': final.scalar(\"SELECT done FROM items WHERE title = 'buy milk'\")}\n",
}


def judge(body: dict[str, Any]) -> Reply:
    """The scripted judge: complete when the evidence's one value is there (or, for a question,
    is in the agent's final answer)."""
    text = user_text(body)
    evidence = json.loads(text.split("(from the databases before and after)\n", 1)[1].split("\n\n## ", 1)[0])
    answer = text.rsplit("Final answer of the agent: ", 1)[1]
    ((key, value),) = evidence.items()
    done = str(value) in answer if key == "expected_in_answer" else bool(value)
    return Reply.json({"reasoning": f"{key}={value}", "classification": "complete" if done else "incomplete"})


SOLUTIONS = {
    ("library", 0): {"steps": [{"tool": "search_books", "arguments": {"query": "Dune"}},
                               {"tool": "borrow_book", "arguments": {"book_id": 1}}], "final_answer": None},
    ("library", 1): {"steps": [{"tool": "search_books", "arguments": {"query": ""}}],
                     "final_answer": "2 books are available."},
    ("todo", 0): {"steps": [{"tool": "add_item", "arguments": {"list_name": "Home", "title": "pay rent"}}],
                  "final_answer": None},
    ("todo", 1): {"steps": [{"tool": "list_items", "arguments": {"list_name": "Home"}},
                            {"tool": "complete_item", "arguments": {"item_id": 1}}], "final_answer": None},
}


def _task_index(scenario: str, body: dict[str, Any]) -> int:
    text = user_text(body)
    for i, task in enumerate(TASKS[scenario]):
        if f"Task: {task}" in text:
            return i
    raise AssertionError(f"no known task in: {text[-300:]}")


def _feedback_given(body: dict[str, Any]) -> bool:
    return "was executed and failed" in user_text(body)


class Script:
    """Good answers, preceded (once each) by the broken ones a real model also produces."""

    def __init__(self, faults: bool = True, judge_mode: bool = False, stubborn: bool = False) -> None:
        self.faults = faults
        self.judge_mode = judge_mode
        self.stubborn = stubborn  # the todo app's tools never get fixed (keep-best)
        self.served: list[str] = []

    def __call__(self, stage: str, body: dict[str, Any], index: int) -> Reply:
        scenario = scenario_of(body)
        fault = self._fault(stage, scenario, body, index) if self.faults else None
        if fault is not None:
            self.served.append(f"{stage}:{scenario}:fault")
            return fault
        self.served.append(f"{stage}:{scenario}")
        if stage == "scenario":
            return Reply.json({"scenarios": SCENARIOS})
        if stage == "classify":
            return Reply.json({"classifications": [
                {"name": name, "categories": ["test"], "suitability_score": 2 if name == "stock_ticker" else 8,
                 "suitability_level": "low" if name == "stock_ticker" else "high", "reasoning": "scripted"}
                for name in re.findall(r"^- (\w+):", user_text(body), re.M)]})
        if stage == "task":
            return Reply.json({"tasks": TASKS[scenario]})
        if stage == "db":
            return Reply.json({"ddl": DDL[scenario]})
        if stage == "sample":
            return Reply.json({"tables": SEED[scenario]})
        if stage == "spec":
            return Reply.json({"tools": SPEC[scenario]})
        if stage == "env":
            return Reply.json(ENV[scenario])
        if stage == "verifier" and self.judge_mode:
            key = (scenario, _task_index(scenario, body))
            if key == ("library", 0) and not _feedback_given(body):  # evidence that is not JSON: repaired
                self.served.append("verifier:library:not-json")
                return Reply.json({"code": "def verify(final, initial, answer):\n    return {'ids': {1, 2}}\n",
                                   "success_criteria": "x", "failure_criteria": "y"})
            return Reply.json({"code": EVIDENCE[key], "success_criteria": f"the task {key} is done",
                               "failure_criteria": "anything else"})
        if stage == "verifier":
            return Reply.json({"code": VERIFIERS[(scenario, _task_index(scenario, body))]})
        if stage == "unknown" and self.judge_mode:  # the LLM judge's prompt carries no stage tag
            return judge(body)
        if stage == "solution":
            return Reply.json(SOLUTIONS[(scenario, _task_index(scenario, body))])
        raise AssertionError(f"unexpected stage {stage}")

    def _fault(self, stage: str, scenario: str, body: dict[str, Any], index: int) -> Reply | None:
        repaired = _feedback_given(body) or "could not be used" in user_text(body)
        if stage == "scenario" and index == 0:
            return Reply("Here are the scenarios: {\"scenarios\": [ {\"name\": \"library\", ")  # truncated JSON
        if stage == "task" and index == 0:
            return Reply(status=429, headers={"retry-after": "0"})
        if stage == "db" and scenario == "library" and not repaired:
            return Reply.json({"ddl": DDL["library"].replace("REFERENCES books(id)", "REFERENCES book(id)")})
        if stage == "sample" and scenario == "library" and not repaired:
            broken = [dict(t) for t in SEED["library"]]
            broken[2] = {"table": "loans", "rows": [{"id": 1, "book_id": 3, "member_id": 99, "returned": False}]}
            return Reply.json({"tables": broken})
        if stage == "env" and scenario == "todo" and (not repaired or self.stubborn):
            env = {"prelude": ENV["todo"]["prelude"], "tools": [dict(t) for t in ENV["todo"]["tools"]]}
            env["tools"][0]["code"] = "def list_items(db, list_name):\n    return 1 / 0\n"
            return Reply.json(env)
        if stage == "verifier" and scenario == "library" and not repaired and re.search("Task: Borrow", user_text(body)):
            return Reply.json({"code": "def verify(final, initial, answer):\n    return True, 'looks fine'\n"})
        if stage == "solution" and scenario == "todo" and not repaired and "Task: Mark" in user_text(body):
            return Reply.json({"steps": [{"tool": "complete_item", "arguments": {"item_id": 2}}], "final_answer": None})
        return None
