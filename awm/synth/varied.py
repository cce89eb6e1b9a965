"""A catalog of many *distinct* environments for scale tests, generated without a model.

Scale work (late binding, Postgres shards, campaigns over hundreds of environments) needs a
catalog of ~1,000 environments that differ the way synthesised ones do: different schemas (2 to
8 tables, a dozen column types, foreign keys with different delete rules, link tables with
composite keys, identity or serial keys), different tools (which lookups, writes and aggregates
exist, and how they are named and described) and different tasks with their own verifiers and
reference solutions. One fixture copied under 1,000 names would hide exactly what scale tests
must see: 1,000 different template databases, tool lists and worker code.

Every environment is a valid :class:`awm.bundle.EnvBundle` built from ``random.Random`` seeded
with ``(seed, index)``, so a catalog is a pure function of ``(count, seed)`` and of this file. The
verifiers read only ``initial``/``final`` and the answer, and each task is built so that it is
not complete on the snapshot (a value to change differs, a row to add or remove is absent or
present, a question needs an answer) and complete after its reference solution.

Built catalogs are cached by content under ``$AWM_CATALOG_CACHE`` or ``~/.cache/awm/catalogs``
(the key hashes this module's source, the count and the seed), like images/build.py caches images:

    python -m awm.synth.varied --count 1000            # build (or find) the catalog, print its path
    python -m awm.synth.varied --count 1000 --check    # also load every snapshot into Postgres once
    python -m awm.synth.varied --count 1000 --gates    # serve each one and run both gates of every task
    awm serve --catalog "$(python -m awm.synth.varied --count 1000 --path-only)" --allow-ungated

Environments come in three sizes (``.build.json`` lists each one's): ``small`` (3-15 rows a
table), ``medium`` (40-250) and ``large`` (one table of 1,500-3,000 rows). The tasks carry no
gate records: the generator does not run them; serve with ``--allow-ungated``, or record the
gates with ``awm catalog validate --record``; ``--gates`` runs both gates of every task without
recording them (tests/test_varied_catalog.py does it for a sample).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from awm import settings
from awm.catalog import cache_root
from awm.bundle import Database, EnvBundle, Limits, Scenario, SeedTable, Task, Tool, ToolCall, Verifier

FORMAT = "awm.varied/v1"

# Domains: a phrase for the scenario and the entities (table names: singular, none a SQL
# reserved word, none a Python keyword).
THEMES: dict[str, tuple[str, list[str]]] = {
    "logistics": ("a regional parcel carrier", ["shipment", "depot", "carrier", "parcel", "route", "driver", "vehicle", "manifest"]),
    "clinic": ("an outpatient clinic", ["patient", "physician", "appointment", "prescription", "ward", "referral", "invoice", "allergy"]),
    "library": ("a city library network", ["book", "author", "member", "loan", "branch", "shelf", "publisher", "hold_request"]),
    "school": ("a secondary school", ["student", "course", "teacher", "enrollment", "classroom", "assignment", "grade_report", "club"]),
    "restaurant": ("a restaurant group", ["dish", "ingredient", "supplier", "reservation", "waiter", "menu_section", "tab", "shift"]),
    "hotel": ("a boutique hotel", ["guest", "room", "booking", "housekeeper", "amenity", "rate_plan", "folio", "complaint"]),
    "fitness": ("a chain of gyms", ["athlete", "coach", "workout", "training_slot", "gym_location", "membership_plan", "measurement", "badge"]),
    "farm": ("a mixed arable farm", ["field", "crop", "harvest", "tractor", "farmhand", "irrigation_zone", "buyer", "soil_test"]),
    "museum": ("a natural history museum", ["exhibit", "artifact", "curator", "loan_agreement", "gallery", "donor", "tour", "conservation_job"]),
    "airline": ("a small airline", ["flight", "aircraft", "pilot", "passenger", "airport", "crew_roster", "baggage_tag", "fare_class"]),
    "realty": ("a real-estate agency", ["property", "agent", "listing", "viewing", "landlord", "tenant", "lease", "inspection"]),
    "devtools": ("a source-code hosting service", ["repository", "contributor", "pull_request", "release", "ticket", "pipeline", "reviewer", "tag"]),
    "retail": ("a chain of hardware stores", ["product", "store", "customer", "purchase", "promotion", "vendor", "stock_count", "return_slip"]),
    "events": ("a concert promoter", ["venue", "performer", "concert", "ticket", "sponsor", "stage", "attendee", "stall"]),
    "insurance": ("a home insurer", ["policyholder", "policy", "claim_case", "adjuster", "premium", "coverage", "incident", "broker"]),
    "zoo": ("a city zoo", ["animal", "enclosure", "keeper", "feeding", "species", "vet_visit", "habitat", "pledge"]),
    "brewery": ("a craft brewery", ["beer", "batch", "hop_variety", "fermenter", "taproom", "distributor", "keg", "tasting"]),
    "charity": ("a food-bank charity", ["donor", "campaign", "donation", "volunteer", "beneficiary", "grant_award", "drive", "pledge"]),
    "garage": ("a car repair garage", ["car", "mechanic", "repair_job", "part", "client", "bay", "estimate", "warranty"]),
    "cinema": ("an arthouse cinema", ["film", "director", "actor", "screening", "auditorium", "festival", "review", "distributor"]),
    "energy": ("a wind-farm operator", ["turbine", "site", "technician", "outage", "meter", "reading", "contract", "inspection"]),
    "bank": ("a community bank", ["account_holder", "bank_account", "transfer", "branch_office", "loan", "teller", "card", "statement"]),
    "recruiting": ("a recruiting agency", ["candidate", "job_opening", "interview", "recruiter", "job_offer", "department", "referral", "skill"]),
    "observatory": ("a mountain observatory", ["telescope", "observation", "astronomer", "star", "survey", "proposal", "instrument", "night_log"]),
}

ADJECTIVES = ["amber", "brisk", "cobalt", "dusky", "ember", "fern", "granite", "hazel", "indigo", "jade",
              "kestrel", "lunar", "maple", "north", "onyx", "pine", "quartz", "russet", "silver", "tidal",
              "umber", "violet", "willow", "yarrow", "zephyr", "coral", "slate", "cedar", "harbor", "meadow"]
NOUNS = ["falcon", "harbor", "summit", "meadow", "river", "beacon", "canyon", "orchard", "prairie", "glacier",
         "lantern", "compass", "anchor", "thistle", "quarry", "delta", "spire", "grove", "ridge", "cove"]
FIRST = ["ada", "bruno", "chloe", "dev", "elena", "farid", "greta", "hiro", "ines", "jonas", "kira", "luca",
         "maya", "nils", "olga", "pavel", "quinn", "rosa", "sami", "tara"]
LAST = ["abara", "berg", "costa", "diaz", "eklund", "fox", "garcia", "holm", "ito", "jensen", "khan", "lindqvist",
        "moreau", "novak", "okoro", "petrov", "quist", "rossi", "sato", "tanaka"]
WORDS = ["north", "annual", "priority", "spare", "legacy", "express", "weekend", "backup", "premium", "standard",
         "pending", "archived", "draft", "rush", "bulk", "trial", "renewal", "partner", "local", "remote"]

# Attribute columns: name -> kind. A table draws 1-6 of them.
ATTRIBUTES: dict[str, str] = {
    "quantity": "int", "capacity": "int", "priority_level": "smallint", "rank_order": "int", "floor_number": "smallint",
    "seats": "int", "points": "int", "external_number": "bigint", "serial_number": "bigint",
    "price": "numeric", "cost": "numeric", "balance": "numeric", "weight_kg": "numeric", "fee": "numeric",
    "budget": "numeric", "rating": "float", "score": "float", "latitude": "float",
    "notes": "text", "summary": "text", "city": "varchar", "region": "varchar", "colour": "varchar",
    "contact_email": "varchar", "channel": "varchar",
    "opened_on": "date", "due_on": "date", "started_on": "date", "expires_on": "date",
    "created_at": "timestamptz", "updated_at": "timestamptz", "last_seen_at": "timestamptz",
    "is_active": "bool", "archived": "bool", "verified": "bool", "featured": "bool",
    "attributes": "jsonb", "settings": "jsonb", "external_ref": "uuid",
    "status": "enum", "tier": "enum", "category": "enum", "stage": "enum",
}
ENUM_VALUES = {
    "status": ["open", "active", "on_hold", "closed", "cancelled", "pending"],
    "tier": ["bronze", "silver", "gold", "platinum"],
    "category": ["alpha", "beta", "gamma", "delta", "epsilon"],
    "stage": ["new", "review", "approved", "done"],
}
SQL_TYPE = {"int": "integer", "smallint": "smallint", "bigint": "bigint", "numeric": "numeric(12,2)",
            "float": "double precision", "text": "text", "varchar": "varchar(80)", "date": "date",
            "timestamptz": "timestamptz", "bool": "boolean", "jsonb": "jsonb", "uuid": "uuid", "enum": "text"}
CAST = {"int": "integer", "smallint": "smallint", "bigint": "bigint", "numeric": "numeric", "float": "double precision",
        "text": "text", "varchar": "varchar", "date": "date", "timestamptz": "timestamptz", "bool": "boolean",
        "jsonb": "jsonb", "uuid": "uuid", "enum": "text"}
JSON_TYPE: dict[str, dict[str, Any]] = {
    "int": {"type": "integer"}, "smallint": {"type": "integer", "minimum": -32768, "maximum": 32767},
    "bigint": {"type": "integer"}, "numeric": {"type": "number"}, "float": {"type": "number"},
    "text": {"type": "string"}, "varchar": {"type": "string", "maxLength": 80},
    "date": {"type": "string", "description": "YYYY-MM-DD"},
    "timestamptz": {"type": "string", "description": "ISO 8601 date-time"}, "bool": {"type": "boolean"},
    "jsonb": {"type": "object"}, "uuid": {"type": "string", "description": "UUID"}, "enum": {"type": "string"},
}
PK_STYLES = ["id serial PRIMARY KEY", "id bigserial PRIMARY KEY",
             "id integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
             "id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"]
KEY_STYLES = ["name", "code", "title", "handle", "email"]
SIZES = {"small": (3, 15), "medium": (40, 250), "large": (1500, 3000)}


@dataclass
class Column:
    name: str
    kind: str
    not_null: bool = False
    check: str | None = None
    default: str | None = None

    @property
    def choices(self) -> list[str] | None:
        return ENUM_VALUES.get(self.name) if self.kind == "enum" else None

    def ddl(self) -> str:
        parts = [self.name, SQL_TYPE[self.kind]]
        if self.not_null:
            parts.append("NOT NULL")
        if self.default is not None:
            parts.append(f"DEFAULT {self.default}")
        if self.choices:
            parts.append("CHECK (" + self.name + " IN (" + ", ".join(f"'{c}'" for c in self.choices) + "))")
        elif self.check:
            parts.append(f"CHECK ({self.check})")
        return " ".join(parts)

    def json_schema(self) -> dict[str, Any]:
        schema = dict(JSON_TYPE[self.kind])
        if self.choices:
            schema["enum"] = list(self.choices)
        return schema


@dataclass
class ForeignKey:
    column: str
    parent: str
    on_delete: str  # CASCADE | RESTRICT | SET NULL
    nullable: bool


@dataclass
class Table:
    name: str
    pk: str
    key: str  # the natural key column (unique text)
    key_style: str
    columns: list[Column]
    fks: list[ForeignKey] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    lookup: str = "find"  # find (exact key) | search (substring, a list)

    def ddl(self) -> str:
        lines = [self.pk, f"{self.key} text NOT NULL UNIQUE"]
        lines += [c.ddl() for c in self.columns]
        for fk in self.fks:
            null = "" if fk.nullable else " NOT NULL"
            lines.append(f"{fk.column} integer{null} REFERENCES {fk.parent}(id) ON DELETE {fk.on_delete}")
        return f"CREATE TABLE {self.name} (\n    " + ",\n    ".join(lines) + "\n);"

    def select_list(self, alias: str = "") -> str:
        """Every column, uuid as text (tool results must be JSON)."""
        a = f"{alias}." if alias else ""
        cols = ["id", self.key] + [c.name for c in self.columns] + [f.column for f in self.fks]
        kinds = {c.name: c.kind for c in self.columns}
        return ", ".join(f"{a}{c}::text AS {c}" if kinds.get(c) == "uuid" else f"{a}{c}" for c in cols)


@dataclass
class LinkTable:
    name: str
    left: str
    right: str
    extra: Column
    rows: list[dict[str, Any]] = field(default_factory=list)

    def ddl(self) -> str:
        return (f"CREATE TABLE {self.name} (\n    {self.left}_id integer NOT NULL REFERENCES {self.left}(id) ON DELETE CASCADE,\n"
                f"    {self.right}_id integer NOT NULL REFERENCES {self.right}(id) ON DELETE CASCADE,\n"
                f"    {self.extra.ddl()},\n    PRIMARY KEY ({self.left}_id, {self.right}_id)\n);")


@dataclass
class Schema:
    tables: list[Table]
    links: list[LinkTable]
    indexes: list[str]

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)

    def children(self, parent: str) -> list[tuple[Table, ForeignKey]]:
        return [(t, fk) for t in self.tables for fk in t.fks if fk.parent == parent]

    def referenced_ids(self, parent: str) -> set[int]:
        ids = {r[fk.column] for t, fk in self.children(parent) for r in t.rows if r.get(fk.column) is not None}
        for link in self.links:
            for side in (link.left, link.right):
                if side == parent:
                    ids |= {r[f"{side}_id"] for r in link.rows}
        return ids


# --------------------------------------------------------------------------- values


def _value(rng: random.Random, col: Column) -> Any:
    kind = col.kind
    if kind == "int":
        return rng.randint(0, 500)
    if kind == "smallint":
        return rng.randint(1, 9)
    if kind == "bigint":
        return rng.randint(10**8, 10**11)
    if kind == "numeric":
        return round(rng.uniform(1, 5000), 2)
    if kind == "float":
        return round(rng.uniform(0, 100), 3)
    if kind == "text":
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
    if kind == "varchar":
        if col.name == "contact_email":
            return f"{rng.choice(FIRST)}.{rng.choice(LAST)}@example.test"
        return rng.choice(ADJECTIVES).title() + " " + rng.choice(NOUNS).title()
    if kind == "date":
        return (dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 900))).isoformat()
    if kind == "timestamptz":
        at = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=rng.randint(0, 900 * 1440))
        return at.isoformat()
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "jsonb":
        return {"colour": rng.choice(ADJECTIVES), "level": rng.randint(1, 5), "tags": rng.sample(WORDS, 2)}
    if kind == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "enum":
        return rng.choice(col.choices or ["x"])
    raise ValueError(f"unknown column kind {kind!r}")


def _key_value(rng: random.Random, table: Table, index: int, numbered: bool) -> str:
    style = table.key_style
    suffix = f" {index + 1}" if numbered else ""
    if style == "code":
        return f"{table.name[:3].upper()}-{index + 1:04d}"
    if style == "email":
        return f"{rng.choice(FIRST)}.{rng.choice(LAST)}{index + 1}@{table.name.replace('_', '')}.test"
    if style == "handle":
        return f"{rng.choice(ADJECTIVES)}_{rng.choice(NOUNS)}_{index + 1}"
    if style == "title":
        return f"The {rng.choice(ADJECTIVES).title()} {rng.choice(NOUNS).title()}{suffix}"
    return f"{rng.choice(ADJECTIVES).title()} {rng.choice(NOUNS).title()}{suffix}"


def _different(rng: random.Random, col: Column, current: Any) -> Any:
    """A value of the column's kind that differs from ``current`` (what an update task sets)."""
    if col.kind == "bool":
        return not current
    for _ in range(100):
        value = _value(rng, col)
        if value != current:
            return value
    raise AssertionError(f"no value differs from {current!r} for {col.name}")


# --------------------------------------------------------------------------- schema


def make_schema(rng: random.Random, theme: str, size: str) -> Schema:
    nouns = list(THEMES[theme][1])
    rng.shuffle(nouns)
    n_tables = rng.choice([2, 2, 3, 3, 3, 4, 4, 5, 6, 7, 8])
    tables: list[Table] = []
    for i, name in enumerate(nouns[:n_tables]):
        attrs = rng.sample(sorted(ATTRIBUTES), rng.randint(1, 6))
        columns = []
        for attr in attrs:
            kind = ATTRIBUTES[attr]
            col = Column(attr, kind, not_null=rng.random() < 0.5)
            if kind in ("int", "numeric") and rng.random() < 0.4:
                col.check = f"{attr} >= 0"
            if kind == "bool" and rng.random() < 0.5:
                col.default, col.not_null = "false", True
            if kind == "timestamptz" and rng.random() < 0.3:
                col.default = "'2024-01-01T00:00:00+00:00'"
            columns.append(col)
        style = rng.choice(KEY_STYLES)  # the key column is named after its style
        table = Table(name, rng.choice(PK_STYLES), style, style, columns, lookup=rng.choice(["find", "find", "search"]))
        if i > 0:
            for parent in rng.sample(tables, min(len(tables), rng.choice([0, 1, 1, 1, 2]))):
                on_delete = rng.choice(["CASCADE", "RESTRICT", "SET NULL"])
                table.fks.append(ForeignKey(f"{parent.name}_id", parent.name, on_delete,
                                            nullable=on_delete == "SET NULL" or rng.random() < 0.3))
        tables.append(table)
    lo, hi = SIZES["medium" if size == "large" else size]
    big = rng.randrange(len(tables)) if size == "large" else -1
    for i, table in enumerate(tables):
        count = rng.randint(*SIZES["large"]) if i == big else rng.randint(lo, hi)
        numbered = count > 12 or table.key_style in ("name", "title")
        keys: set[str] = set()
        for r in range(count):
            key = _key_value(rng, table, r, numbered)
            while key in keys:  # name/title styles may repeat without a number
                key += f" {r + 1}"
            keys.add(key)
            row: dict[str, Any] = {"id": r + 1, table.key: key}
            for col in table.columns:
                row[col.name] = None if not col.not_null and rng.random() < 0.1 else _value(rng, col)
            for fk in table.fks:
                parent = next(t for t in tables if t.name == fk.parent)
                row[fk.column] = None if fk.nullable and rng.random() < 0.15 else rng.randint(1, len(parent.rows))
            table.rows.append(row)
    links = []
    if len(tables) >= 3 and rng.random() < 0.4:
        left, right = rng.sample(tables, 2)
        extra = Column(rng.choice(["quantity", "seats", "points"]), "int", not_null=True, default="1")
        link = LinkTable(f"{left.name}_{right.name}", left.name, right.name, extra)
        pairs = {(rng.randint(1, len(left.rows)), rng.randint(1, len(right.rows)))
                 for _ in range(min(len(left.rows) * len(right.rows) // 2, rng.randint(3, 30)))}
        link.rows = [{f"{left.name}_id": a, f"{right.name}_id": b, extra.name: rng.randint(1, 9)} for a, b in sorted(pairs)]
        links.append(link)
    indexes = [f"CREATE INDEX ON {t.name} ({fk.column});" for t in tables for fk in t.fks if rng.random() < 0.6]
    indexes += [f"CREATE INDEX ON {t.name} ({c.name});" for t in tables for c in t.columns
                if c.kind in ("date", "enum", "timestamptz") and rng.random() < 0.3]
    return Schema(tables, links, indexes)


def ddl_of(schema: Schema) -> str:
    parts = [t.ddl() for t in schema.tables] + [link.ddl() for link in schema.links] + schema.indexes
    return "\n\n".join(parts) + "\n"


# --------------------------------------------------------------------------- tools


PRELUDE = '''import json


def _one_or_error(row, what):
    if row is None:
        raise ToolError(f"{what} not found")
    return row


def _param(value, kind):
    """jsonb arguments travel as JSON text and are cast in SQL."""
    return json.dumps(value) if kind == "jsonb" and value is not None else value
'''

VERIFIER_PRELUDE = '''import re


def _numbers(answer):
    cleaned = re.sub(r"(?<=\\d),(?=\\d{3}\\b)", "", str(answer or ""))
    return [float(x) for x in re.findall(r"-?\\d+(?:\\.\\d+)?", cleaned)]


def _mentions(answer, text):
    return answer is not None and str(text).strip().lower() in str(answer).lower()
'''


def _tool(name: str, description: str, params: dict[str, dict[str, Any]], required: list[str], code: str) -> Tool:
    schema = {"type": "object", "properties": params, "required": required, "additionalProperties": False}
    return Tool(name=name, description=description, input_schema=schema, code=code.strip() + "\n")


def _signature(params: dict[str, dict[str, Any]], required: list[str]) -> str:
    """Keyword-only arguments (tools are called with ``**arguments``): a required one may follow an optional one."""
    names = [p if p in required else f"{p}=None" for p in params]
    return ", ".join(["db", "*", *names]) if names else "db"


def tools_for(rng: random.Random, schema: Schema, table: Table) -> dict[str, Tool]:
    """Every tool this table could have, by kind; the environment keeps a random subset."""
    t, k, sel = table.name, table.key, table.select_list()
    words = t.replace("_", " ")
    idp = f"{t}_id"
    tools: dict[str, Tool] = {}
    tools["get"] = _tool(f"get_{t}", f"Fetch one {words} by its numeric id.", {idp: {"type": "integer"}}, [idp], f'''
def get_{t}(db, {idp}):
    return _one_or_error(db.one("SELECT {sel} FROM {t} WHERE id = %s", {idp}), f"{words} {{{idp}}}")
''')
    if table.lookup == "find":
        tools["lookup"] = _tool(f"find_{t}_by_{k}", f"Look up a {words} by its exact {k} (case-insensitive).",
                                {k: {"type": "string"}}, [k], f'''
def find_{t}_by_{k}(db, {k}):
    return _one_or_error(db.one("SELECT {sel} FROM {t} WHERE lower({k}) = lower(%s)", {k}), f"{words} {{{k}!r}}")
''')
    else:
        tools["lookup"] = _tool(f"search_{t}", f"Search {words} records whose {k} contains the given text; at most 10.",
                                {"text": {"type": "string", "minLength": 1}}, ["text"], f'''
def search_{t}(db, text):
    pattern = "%" + text.replace("\\\\", "\\\\\\\\").replace("%", "\\\\%").replace("_", "\\\\_") + "%"
    return db.query("SELECT {sel} FROM {t} WHERE {k} ILIKE %s ORDER BY id LIMIT 10", pattern)
''')
    filters = [c for c in table.columns if c.kind in ("enum", "bool")]
    limit = {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}
    if filters:
        f = rng.choice(filters)
        cast = CAST[f.kind]
        tools["list"] = _tool(f"list_{t}", f"List {words} records, optionally only those with the given {f.name}.",
                              {"limit": limit, f.name: f.json_schema()}, [], f'''
def list_{t}(db, limit=20, {f.name}=None):
    return db.query("SELECT {sel} FROM {t} WHERE (%s::{cast} IS NULL OR {f.name} = %s::{cast}) ORDER BY id LIMIT %s",
                    {f.name}, {f.name}, limit)
''')
    else:
        tools["list"] = _tool(f"list_{t}", f"List {words} records in id order.", {"limit": limit}, [], f'''
def list_{t}(db, limit=20):
    return db.query("SELECT {sel} FROM {t} ORDER BY id LIMIT %s", limit)
''')
    # create: the key, every column (required if NOT NULL without a default), every parent id
    params: dict[str, dict[str, Any]] = {k: {"type": "string", "minLength": 1}}
    required = [k]
    kinds = {k: "text"}
    for c in table.columns:
        params[c.name] = c.json_schema()
        kinds[c.name] = c.kind
        if c.not_null and c.default is None:
            required.append(c.name)
    for fk in table.fks:
        params[fk.column] = {"type": "integer"}
        kinds[fk.column] = "int"
        if not fk.nullable:
            required.append(fk.column)
    checks = "".join(f'''
    if {fk.column} is not None and db.one("SELECT 1 AS x FROM {fk.parent} WHERE id = %s", {fk.column}) is None:
        raise ToolError(f"{fk.parent.replace('_', ' ')} {{{fk.column}}} not found")''' for fk in table.fks)
    columns = list(params)
    values = ", ".join(f"_param({c}, {kinds[c]!r})" for c in columns)
    tools["create"] = _tool(f"create_{t}", f"Create a {words}. Returns the new record with its id.", params, required, f'''
def create_{t}({_signature(params, required)}):
    if db.one("SELECT 1 AS x FROM {t} WHERE lower({k}) = lower(%s)", {k}) is not None:
        raise ToolError(f"a {words} with {k} {{{k}!r}} already exists"){checks}
    values = {{name: value for name, value in zip({columns!r}, [{values}])}}
    casts = dict(zip({columns!r}, {[CAST[kinds[c]] for c in columns]!r}))
    names = [name for name, value in values.items() if value is not None]
    placeholders = ", ".join(f"%s::{{casts[name]}}" for name in names)
    row = db.one(f"INSERT INTO {t} ({{', '.join(names)}}) VALUES ({{placeholders}}) RETURNING id", *[values[n] for n in names])
    return db.one("SELECT {sel} FROM {t} WHERE id = %s", row["id"])
''')
    for c in table.columns:
        tools[f"set:{c.name}"] = _tool(
            f"set_{t}_{c.name}", f"Change the {c.name.replace('_', ' ')} of one {words}.",
            {idp: {"type": "integer"}, c.name: c.json_schema()}, [idp, c.name], f'''
def set_{t}_{c.name}(db, {idp}, {c.name}):
    count = db.execute("UPDATE {t} SET {c.name} = %s::{CAST[c.kind]} WHERE id = %s", _param({c.name}, {c.kind!r}), {idp})
    if count == 0:
        raise ToolError(f"{words} {{{idp}}} not found")
    return db.one("SELECT {sel} FROM {t} WHERE id = %s", {idp})
''')
    tools["delete"] = _tool(f"delete_{t}", f"Delete one {words} by id.", {idp: {"type": "integer"}}, [idp], f'''
def delete_{t}(db, {idp}):
    if db.execute("DELETE FROM {t} WHERE id = %s", {idp}) == 0:
        raise ToolError(f"{words} {{{idp}}} not found")
    return {{"deleted": {idp}}}
''')
    for child, fk in schema.children(t):
        tools[f"count:{child.name}:{fk.column}"] = _tool(
            f"count_{child.name}_by_{fk.column}", f"Count the {child.name.replace('_', ' ')} records of one {words}.",
            {idp: {"type": "integer"}}, [idp], f'''
def count_{child.name}_by_{fk.column}(db, {idp}):
    return {{"{t}_id": {idp}, "count": db.scalar("SELECT count(*) FROM {child.name} WHERE {fk.column} = %s", {idp})}}
''')
    for c in table.columns:
        if c.kind in ("numeric", "int"):
            tools[f"total:{c.name}"] = _tool(
                f"total_{t}_{c.name}", f"Sum of {c.name.replace('_', ' ')} over every {words}.", {}, [], f'''
def total_{t}_{c.name}(db):
    return {{"total": db.scalar("SELECT coalesce(sum({c.name}), 0) FROM {t}")}}
''')
    return tools


def link_tool(link: LinkTable) -> Tool:
    a, b, extra = f"{link.left}_id", f"{link.right}_id", link.extra.name
    return _tool(f"link_{link.name}", f"Attach a {link.right.replace('_', ' ')} to a {link.left.replace('_', ' ')} "
                 f"with a {extra}.", {a: {"type": "integer"}, b: {"type": "integer"}, extra: {"type": "integer", "minimum": 1}},
                 [a, b, extra], f'''
def link_{link.name}(db, {a}, {b}, {extra}):
    if db.one("SELECT 1 AS x FROM {link.name} WHERE {a} = %s AND {b} = %s", {a}, {b}) is not None:
        raise ToolError("already attached")
    for table, key in (("{link.left}", {a}), ("{link.right}", {b})):
        if db.one(f"SELECT 1 AS x FROM {{table}} WHERE id = %s", key) is None:
            raise ToolError(f"{{table}} {{key}} not found")
    db.execute("INSERT INTO {link.name} ({a}, {b}, {extra}) VALUES (%s, %s, %s)", {a}, {b}, {extra})
    return {{"{a}": {a}, "{b}": {b}, "{extra}": {extra}}}
''')


# --------------------------------------------------------------------------- tasks


@dataclass
class Draft:
    """A task and the tool kinds (``(table, kind)``) its solution needs."""

    task: Task
    needs: list[tuple[str, str]]


def _lookup_step(table: Table, row: dict[str, Any]) -> ToolCall:
    key = row[table.key]
    if table.lookup == "find":
        return ToolCall(tool=f"find_{table.name}_by_{table.key}", arguments={table.key: key})
    return ToolCall(tool=f"search_{table.name}", arguments={"text": key})


def _lit(value: Any) -> str:
    return repr(json.dumps(value) if isinstance(value, dict) else value)


def draft_tasks(rng: random.Random, schema: Schema) -> list[Draft]:
    kinds = ["update", "update", "create", "delete", "count", "total", "lookup", "link"]
    drafts: list[Draft] = []
    ids: set[str] = set()
    for _ in range(40):
        if len(drafts) >= rng.randint(2, 5):
            break
        kind = rng.choice(kinds)
        draft = _draft(rng, schema, kind)
        if draft is not None and draft.task.id not in ids:
            ids.add(draft.task.id)
            drafts.append(draft)
    if len(drafts) < 2:  # every schema supports updates and creates
        for kind in ("update", "create"):
            draft = _draft(rng, schema, kind)
            if draft is not None and draft.task.id not in ids:
                ids.add(draft.task.id)
                drafts.append(draft)
    return drafts


def _draft(rng: random.Random, schema: Schema, kind: str) -> Draft | None:
    table = rng.choice(schema.tables)
    t, k, words = table.name, table.key, table.name.replace("_", " ")
    if kind == "update":
        col = rng.choice(table.columns)
        row = rng.choice(table.rows)
        value = _different(rng, col, row[col.name])
        shown = json.dumps(value) if isinstance(value, (dict, bool)) else value
        instruction = (f"Change the {col.name.replace('_', ' ')} of the {words} whose {k} is \"{row[k]}\" to {shown}. "
                       f"Leave every other {words} as it is.")
        code = f'''
def verify_{{id}}(final, initial, answer):
    row = final.one("SELECT id FROM {t} WHERE {k} = %s", {row[k]!r})
    if row is None:
        return False, "the {words} is gone"
    if not final.scalar("SELECT {col.name} IS NOT DISTINCT FROM %s::{CAST[col.kind]} AS same FROM {t} WHERE id = %s", {_lit(value)}, row["id"]):
        return False, "{col.name} was not changed to the requested value"
    others = "SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x.id), '')) FROM {t} x WHERE x.id <> %s"
    if final.scalar(others, row["id"]) != initial.scalar(others, row["id"]):
        return False, "other {words} records changed"
    return True, "{col.name} changed"
'''
        steps = [_lookup_step(table, row), ToolCall(tool=f"set_{t}_{col.name}", arguments={f"{t}_id": row["id"], col.name: value})]
        return _make(f"update_{t}_{col.name}", instruction, code, steps, None, [(t, "lookup"), (t, f"set:{col.name}")])
    if kind == "create":
        new_key = _key_value(rng, table, len(table.rows) + rng.randint(1000, 9999), True)
        args: dict[str, Any] = {k: new_key}
        for col in table.columns:
            if (col.not_null and col.default is None) or rng.random() < 0.5:
                args[col.name] = _value(rng, col)
        for fk in table.fks:
            if not fk.nullable or rng.random() < 0.5:
                args[fk.column] = rng.randint(1, len(schema.table(fk.parent).rows))
        details = ", ".join(f"{name.replace('_', ' ')} {json.dumps(v) if isinstance(v, (dict, bool)) else v}"
                            for name, v in args.items() if name != k)
        instruction = f"Add a new {words} with {k} \"{new_key}\"" + (f" and {details}." if details else ".")
        checks = "\n".join(f'''    if not final.scalar("SELECT {name} IS NOT DISTINCT FROM %s::{_kind_cast(table, name)} AS same FROM {t} WHERE id = %s", {_lit(v)}, row["id"]):
        return False, "{name} of the new {words} is wrong"''' for name, v in args.items() if name != k)
        code = f'''
def verify_{{id}}(final, initial, answer):
    row = final.one("SELECT id FROM {t} WHERE lower({k}) = lower(%s)", {new_key!r})
    if row is None:
        return False, "no {words} with that {k}"
    if final.scalar("SELECT count(*) FROM {t}") != initial.scalar("SELECT count(*) FROM {t}") + 1:
        return False, "expected exactly one new {words}"
{checks}
    return True, "the {words} exists"
'''
        steps = [ToolCall(tool=f"create_{t}", arguments=args)]
        return _make(f"create_{t}", instruction, code, steps, None, [(t, "create")])
    if kind == "delete":
        referenced = schema.referenced_ids(t)
        free = [r for r in table.rows if r["id"] not in referenced]
        if not free:
            return None
        row = rng.choice(free)
        instruction = f"Delete the {words} whose {k} is \"{row[k]}\"."
        code = f'''
def verify_{{id}}(final, initial, answer):
    if final.one("SELECT id FROM {t} WHERE {k} = %s", {row[k]!r}) is not None:
        return False, "the {words} still exists"
    if final.scalar("SELECT count(*) FROM {t}") != initial.scalar("SELECT count(*) FROM {t}") - 1:
        return False, "expected exactly one {words} fewer"
    return True, "deleted"
'''
        steps = [_lookup_step(table, row), ToolCall(tool=f"delete_{t}", arguments={f"{t}_id": row["id"]})]
        return _make(f"delete_{t}", instruction, code, steps, None, [(t, "lookup"), (t, "delete")])
    if kind == "count":
        children = schema.children(t)
        if not children:
            return None
        child, fk = rng.choice(children)
        row = rng.choice(table.rows)
        n = sum(1 for r in child.rows if r.get(fk.column) == row["id"])
        instruction = (f"How many {child.name.replace('_', ' ')} records point to the {words} whose {k} is "
                       f"\"{row[k]}\" (through {fk.column})? Answer with the number.")
        code = f'''
def verify_{{id}}(final, initial, answer):
    expected = initial.scalar("SELECT count(*) FROM {child.name} c JOIN {t} p ON p.id = c.{fk.column} WHERE p.{k} = %s", {row[k]!r})
    if answer is None:
        return False, "no answer"
    if float(expected) not in _numbers(answer):
        return False, f"the answer does not state {{expected}}"
    return True, "correct count"
'''
        steps = [_lookup_step(table, row), ToolCall(tool=f"count_{child.name}_by_{fk.column}", arguments={f"{t}_id": row["id"]})]
        return _make(f"count_{child.name}_of_{t}", instruction, code, steps, str(n), [(t, "lookup"), (t, f"count:{child.name}:{fk.column}")])
    if kind == "total":
        cols = [c for c in table.columns if c.kind in ("numeric", "int")]
        if not cols:
            return None
        col = rng.choice(cols)
        total = sum(r[col.name] or 0 for r in table.rows)
        shown = f"{total:.2f}" if col.kind == "numeric" else str(total)
        instruction = f"What is the total {col.name.replace('_', ' ')} over all {words} records?"
        code = f'''
def verify_{{id}}(final, initial, answer):
    expected = float(initial.scalar("SELECT coalesce(sum({col.name}), 0) FROM {t}"))
    if answer is None:
        return False, "no answer"
    if not any(abs(n - expected) < 0.01 for n in _numbers(answer)):
        return False, f"the answer does not state {{expected}}"
    return True, "correct total"
'''
        return _make(f"total_{t}_{col.name}", instruction, code, [ToolCall(tool=f"total_{t}_{col.name}")], shown,
                     [(t, f"total:{col.name}")])
    if kind == "lookup":
        cols = [c for c in table.columns if c.kind in ("enum", "varchar", "date", "int", "smallint")]
        if not cols:
            return None
        col = rng.choice(cols)
        rows = [r for r in table.rows if r[col.name] is not None]
        if not rows:
            return None
        row = rng.choice(rows)
        instruction = f"What is the {col.name.replace('_', ' ')} of the {words} whose {k} is \"{row[k]}\"?"
        code = f'''
def verify_{{id}}(final, initial, answer):
    expected = initial.scalar("SELECT {col.name}::text FROM {t} WHERE {k} = %s", {row[k]!r})
    if not _mentions(answer, expected):
        return False, f"the answer does not state {{expected}}"
    return True, "correct"
'''
        return _make(f"lookup_{t}_{col.name}", instruction, code, [_lookup_step(table, row)], str(row[col.name]),
                     [(t, "lookup")])
    if kind == "link":
        if not schema.links:
            return None
        link = schema.links[0]
        left, right = schema.table(link.left), schema.table(link.right)
        taken = {(r[f"{link.left}_id"], r[f"{link.right}_id"]) for r in link.rows}
        free = [(a, b) for a in left.rows[:50] for b in right.rows[:50] if (a["id"], b["id"]) not in taken]
        if not free:
            return None
        a, b = rng.choice(free)
        amount = rng.randint(2, 9)
        instruction = (f"Attach the {right.name.replace('_', ' ')} \"{b[right.key]}\" to the {left.name.replace('_', ' ')} "
                       f"\"{a[left.key]}\" with a {link.extra.name} of {amount}.")
        code = f'''
def verify_{{id}}(final, initial, answer):
    got = final.scalar("SELECT l.{link.extra.name} FROM {link.name} l JOIN {link.left} a ON a.id = l.{link.left}_id "
                       "JOIN {link.right} b ON b.id = l.{link.right}_id WHERE a.{left.key} = %s AND b.{right.key} = %s",
                       {a[left.key]!r}, {b[right.key]!r})
    if got is None:
        return False, "not attached"
    return (got == {amount}, "attached" if got == {amount} else f"{link.extra.name} is {{got}}")
'''
        steps = [_lookup_step(left, a), _lookup_step(right, b),
                 ToolCall(tool=f"link_{link.name}", arguments={f"{link.left}_id": a["id"], f"{link.right}_id": b["id"],
                                                               link.extra.name: amount})]
        return _make(f"link_{link.name}", instruction, code, steps, None,
                     [(link.left, "lookup"), (link.right, "lookup"), (link.name, "link")])
    raise ValueError(kind)


def _kind_cast(table: Table, name: str) -> str:
    for c in table.columns:
        if c.name == name:
            return CAST[c.kind]
    return "integer"  # a foreign key


def _make(task_id: str, instruction: str, code: str, steps: list[ToolCall], answer: str | None,
          needs: list[tuple[str, str]]) -> Draft:
    entry = f"verify_{task_id}"
    verifier = Verifier(code=code.replace("{id}", task_id).strip() + "\n", entrypoint=entry)
    return Draft(Task(id=task_id, instruction=instruction, verifier=verifier, solution=steps, final_answer=answer), needs)


# --------------------------------------------------------------------------- environments


def environment(index: int, seed: int = 0) -> EnvBundle:
    """Environment ``index`` of the catalog generated from ``seed``: a pure function of both."""
    rng = random.Random(f"awm-varied:{seed}:{index}")
    theme = sorted(THEMES)[rng.randrange(len(THEMES))]
    size = rng.choices(["small", "medium", "large"], weights=[70, 25, 5])[0]
    schema = make_schema(rng, theme, size)
    drafts = draft_tasks(rng, schema)
    candidates: dict[tuple[str, str], Tool] = {}
    for table in schema.tables:
        for kind, tool in tools_for(rng, schema, table).items():
            candidates[(table.name, kind)] = tool
    for link in schema.links:
        candidates[(link.name, "link")] = link_tool(link)
    needed = {need for d in drafts for need in d.needs}
    keep = rng.uniform(0.25, 0.8)  # how much of the rest of the API the environment exposes
    tools = [tool for key, tool in candidates.items() if key in needed or rng.random() < keep]
    phrase, _ = THEMES[theme]
    names = ", ".join(t.name.replace("_", " ") for t in schema.tables)
    description = (f"The records of {phrase} (environment {index} of a generated catalog): {names}"
                   + (f", and which {schema.links[0].right.replace('_', ' ')} goes with which "
                      f"{schema.links[0].left.replace('_', ' ')}" if schema.links else "")
                   + ". Look records up by their names or codes before changing them.")
    seed_tables = [SeedTable(table=t.name, rows=t.rows) for t in schema.tables]
    seed_tables += [SeedTable(table=link.name, rows=link.rows) for link in schema.links]
    return EnvBundle(
        scenario=Scenario(name=f"{theme}_{index:04d}", description=description),
        database=Database(ddl=ddl_of(schema), seed=seed_tables),
        tool_prelude=PRELUDE, tools=tools, verifier_prelude=VERIFIER_PRELUDE,
        tasks=[d.task for d in drafts], limits=Limits(),
    )


def describe(bundle: EnvBundle) -> dict[str, Any]:
    """What differs between environments, for the build record and the tests."""
    rows = sum(len(s.rows) for s in bundle.database.seed)
    kinds = sorted({kind for line in bundle.database.ddl.splitlines() for kind in SQL_TYPE.values()
                    if f" {kind}" in line})
    return {"name": bundle.name, "tables": len(bundle.database.seed), "rows": rows,
            "size": "large" if rows >= 1500 else "medium" if rows >= 100 else "small",
            "tools": len(bundle.tools), "tasks": len(bundle.tasks), "column_types": kinds,
            "database_hash": bundle.database_hash()}


# --------------------------------------------------------------------------- the cached catalog


def catalog_key(count: int, seed: int) -> str:
    """Content key: this generator's source, the bundle format's source, the count and the seed."""
    h = hashlib.sha256()
    for path in (Path(__file__), Path(__file__).parent.parent / "bundle.py"):
        h.update(path.read_bytes())
    h.update(f"{FORMAT}\0{count}\0{seed}".encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two builds of the same key: one builds, the other waits
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


BUILD_RECORD = ".build.json"  # hidden: catalog loaders skip dot files


def write_catalog(out: Path, count: int, seed: int = 0) -> dict[str, Any]:
    """Write ``count`` environments as ``<name>.json`` bundles, the catalog index and the build record."""
    from awm import catalog

    if count < 1:
        raise ValueError("count must be at least 1")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    bundles, described, hashes = [], [], set()
    for index in range(count):
        bundle = environment(index, seed)
        if bundle.database_hash() in hashes:  # distinct by construction; checked, not assumed
            raise AssertionError(f"environment {index} repeats an earlier snapshot")
        hashes.add(bundle.database_hash())
        (out / f"{bundle.name}.json").write_text(bundle.model_dump_json())
        bundles.append(bundle)
        described.append(describe(bundle))
    (out / catalog.INDEX).write_text(json.dumps(catalog.index(bundles), indent=1) + "\n")
    record = {"format": FORMAT, "count": count, "seed": seed, "key": catalog_key(count, seed),
              "build_s": round(time.perf_counter() - started, 2),
              "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file()),
              "environments": described}
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def cached_catalog(count: int = 1000, seed: int = 0) -> Path:
    """The catalog's directory in the cache, built there first if it is not (atomically: a
    half-written catalog is never visible under its key)."""
    key = catalog_key(count, seed)
    root = cache_root()
    target = root / f"varied-{count}-s{seed}-{key}"
    with _locked(root / f".lock-{key}"):
        if (target / BUILD_RECORD).is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
        try:
            write_catalog(tmp, count, seed)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def check_snapshots(catalog_dir: Path, admin_dsn: str) -> dict[str, Any]:
    """Load every environment's snapshot into a scratch database, as a template is loaded
    (DDL, every seed row, sequences, snapshot copy, checksum), then drop it: proof that every
    schema and seed of the catalog is valid PostgreSQL, without keeping 1,000 templates."""
    import psycopg
    from psycopg import sql

    from awm import catalog
    from awm.postgres import provision

    provision.ensure_group_roles(admin_dsn)
    timings, failures = [], []
    for bundle in catalog.load(catalog_dir):
        name = f"awm_varied_check_{os.getpid()}"
        t0 = time.perf_counter()
        with provision._admin(admin_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
        try:
            with provision._admin(admin_dsn, name) as db:
                provision.load_snapshot(db, bundle)
        except (provision.ProvisionError, psycopg.Error) as exc:
            failures.append(f"{bundle.name}: {exc}")
        finally:
            with provision._admin(admin_dsn) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        timings.append(time.perf_counter() - t0)
    ordered = sorted(timings)
    return {"loaded": len(timings) - len(failures), "failures": failures, "total_s": round(sum(timings), 1),
            "p50_ms": round(ordered[len(ordered) // 2] * 1000, 1) if ordered else None}


def gate_catalog(catalog_dir: Path, admin_dsn: str, batch: int = 50) -> dict[str, Any]:
    """Serve every environment (``batch`` at a time, one instance each) and run both gates of
    every task, as ``awm catalog validate`` does; nothing is recorded. Returns the counts and
    every failure."""
    import asyncio

    from awm import catalog
    from awm.demo import run_catalog
    from awm.fleet import Database as FleetDatabase

    bundles = catalog.load(catalog_dir)
    started = time.perf_counter()
    tasks = negatives = positives = 0
    failures: list[str] = []
    for start in range(0, len(bundles), batch):
        part = bundles[start:start + batch]
        results, _ = asyncio.run(run_catalog(part, negative_gate=True, allow_ungated=True, show_progress=False,
                                             database=FleetDatabase(admin_dsn)))
        for result, bundle in zip(results, part):
            tasks += result.tasks
            negatives += result.negatives_passed
            positives += result.passed
            if result.served_tools != sorted(t.name for t in bundle.tools):
                failures.append(f"{bundle.name}: served tools differ")
            failures += [f"{bundle.name}/{e.task_id} untouched: {e.verdict}: {e.reason}" for e in result.negatives if not e.ok]
            failures += [f"{bundle.name}/{e.task_id} solution: {e.verdict}: {e.reason}" for e in result.episodes if not e.ok]
    return {"environments": len(bundles), "tasks": tasks, "untouched_gate_passed": negatives,
            "solution_gate_passed": positives, "failures": failures, "wall_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m awm.synth.varied", description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000, help="environments in the catalog (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    ap.add_argument("--out", type=Path, help="write here instead of the cache (not cached)")
    ap.add_argument("--check", action="store_true",
                    help="load every snapshot into the embedded Postgres (or --database-url) once")
    ap.add_argument("--gates", action="store_true",
                    help="serve every environment and run both gates of every task (slow: ~1 s per environment)")
    ap.add_argument("--batch", type=int, default=50, help="environments served at once by --gates")
    ap.add_argument("--database-url", default=settings.AWM_DATABASE_URL,
                    help="admin DSN for --check/--gates (default: a private embedded cluster, removed afterwards)")
    ap.add_argument("--path-only", action="store_true", help="print only the catalog's path")
    args = ap.parse_args(argv)
    if args.count < 1:
        ap.error("--count must be at least 1")
    t0 = time.perf_counter()
    if args.out:
        write_catalog(args.out, args.count, args.seed)
        path = args.out
    else:
        path = cached_catalog(args.count, args.seed)
    if args.path_only:
        print(path)
        return 0
    record = json.loads((path / BUILD_RECORD).read_text())
    envs = record.pop("environments")
    report: dict[str, Any] = {**record, "path": str(path), "wall_s": round(time.perf_counter() - t0, 2),
                              "sizes": {s: sum(e["size"] == s for e in envs) for s in SIZES},
                              "distinct_table_counts": sorted({e["tables"] for e in envs}),
                              "distinct_column_types": sorted({k for e in envs for k in e["column_types"]}),
                              "tools": [min(e["tools"] for e in envs), max(e["tools"] for e in envs)],
                              "tasks": sum(e["tasks"] for e in envs)}
    if args.check or args.gates:
        with _server(args.database_url) as admin_dsn:
            if args.check:
                report["check"] = check_snapshots(path, admin_dsn)
            if args.gates:
                report["gates"] = gate_catalog(path, admin_dsn, args.batch)
    print(json.dumps(report, indent=1))
    return 1 if report.get("check", {}).get("failures") or report.get("gates", {}).get("failures") else 0


@contextlib.contextmanager
def _server(database_url: str | None) -> Iterator[str]:
    """The given server, or a private embedded one in a temporary directory: checking a thousand
    environments leaves a template each (8-9 MB) in the cluster, which must not be the user's."""
    if database_url:
        yield database_url
        return
    from awm.postgres import provision
    from awm.postgres.server import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="awm-varied-"))
    server = EmbeddedPostgres(root / "postgres")
    server.start()
    try:
        provision.harden_cluster(server.admin_dsn())
        yield server.admin_dsn()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
