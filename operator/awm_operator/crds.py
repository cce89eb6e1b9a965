"""The custom resources' types: pydantic models are the single source of their schemas.

``awm operator crds`` renders them as CustomResourceDefinitions (structural OpenAPI v3 schemas,
printer columns, status and scale subresources) into ``charts/awm/crds/``; a test keeps the
files in sync with these models.

API group ``awm.dev``, version ``v1alpha1``:

* ``EnvFleet`` keeps N env-server pods (one instance each) of chosen environments, a warm buffer
  of ready-unallocated instances, and scales between min and max from demand.
* ``EnvClaim`` binds N ready instances (optionally a GRPO group of G instances of one
  environment) and reports their endpoints; deleting it resets them and returns them to the pool.
* ``Campaign`` runs ``awm train`` or ``awm eval`` as a Job against an EnvFleet made for it, shows
  the run's progress, and deletes the fleet when the Job is done (operator side: campaigns.py).
"""

from __future__ import annotations

import fnmatch
from typing import Any, Literal, Mapping, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from awm import settings as awm_settings
from awm.claims import MAX_INSTANCES, ClaimedInstance
from awm_operator.phases import CampaignPhase, ClaimPhase, ShardState

_names = awm_settings.names  # the variables env servers read (declared in awm/settings.py)

GROUP = "awm.dev"
VERSION = "v1alpha1"
MAX_REPLICAS = MAX_INSTANCES


class _Spec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class CatalogSource(_Spec):
    """Where pods get their environment bundles: an image holding ``<path>/<env>.json`` for
    every environment (pulled once per node, shared by all its pods), or an HTTP base URL."""

    image: str | None = Field(None, description="OCI image with the catalog's bundle files.")
    path: str = Field("/catalog", description="Directory of the bundles inside the image.")
    url: str | None = Field(None, description="Base URL serving <env>.json (instead of an image), "
                            "and index.json (the environments, for an environmentSelector).")
    index_config_map: str | None = Field(None, alias="indexConfigMap", description=(
        "ConfigMap (key index.json, from `awm catalog export`) listing an image catalog's "
        "environments, for an environmentSelector."))


class EnvironmentSelector(_Spec):
    """Environments chosen from the catalog's index by name, so that a fleet over a 1,000-
    environment catalog need not list them (the operator re-reads the index every few minutes)."""

    match_names: list[str] = Field(default_factory=lambda: ["*"], alias="matchNames", min_length=1, description=(
        "Shell-style patterns (crm*, *_shop); an environment matching any of them is chosen."))
    exclude_names: list[str] = Field(default_factory=list, alias="excludeNames", description=(
        "Patterns of environments left out."))
    limit: int | None = Field(None, ge=1, le=MAX_REPLICAS, description="At most this many, the first by name.")

    def select(self, names: list[str]) -> list[str]:
        """The chosen environments, sorted by name."""
        chosen = sorted(n for n in set(names) if any(fnmatch.fnmatchcase(n, p) for p in self.match_names)
                        and not any(fnmatch.fnmatchcase(n, p) for p in self.exclude_names))
        return chosen[:self.limit] if self.limit else chosen


class DatabaseRef(_Spec):
    secret_name: str = Field(alias="secretName", description=(
        "Secret with the admin DSN of each Postgres shard (a role with CREATEDB and CREATEROLE): key "
        "`dsn` (shard `default`) and/or `dsn-<name>` (shard `<name>`). A new pod's databases go to the "
        "shard with the most free connection slots. Only the pods' provisioning containers and the "
        "operator read it; the env server never sees it."))


# Pod annotations that switch a container's confinement off (AppArmor, the legacy seccomp ones).
WEAKENING_ANNOTATIONS = ("container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/",
                         "seccomp.security.beta.kubernetes.io/")


class FleetSecurity(_Spec):
    allow_weaker_isolation: bool = Field(False, alias="allowWeakerIsolation", description=(
        "Run untrusted tool and verifier code even where the node lacks Landlock or seccomp (the env "
        "server otherwise refuses it), and accept template annotations that unconfine the container. "
        "Off by default; say so here, explicitly, for nodes that need it."))


class SecretKeyRef(_Spec):
    name: str = Field(description="Secret in the resource's namespace.")
    key: str = Field(description="Key in the Secret.")


class JudgeSpec(_Spec):
    """The LLM judge of judge-verifier tasks (awm.judge): any OpenAI-compatible endpoint. The env
    server calls it; the key reaches only that process (never the confined verifier workers)."""

    base_url: str = Field(alias="baseUrl", description="OpenAI-compatible endpoint (…/v1), e.g. a vLLM Service.")
    model: str = Field(description="Judge model name at that endpoint.")
    api_key_secret: SecretKeyRef | None = Field(None, alias="apiKeySecret", description=(
        "API key of the endpoint (passed to the env server as AWM_JUDGE_API_KEY)."))
    votes: int = Field(1, ge=1, le=15, description="k-vote majority (1 = one deterministic call).")
    timeout_seconds: float = Field(60.0, alias="timeoutSeconds", ge=1, le=600, description="Per request.")
    max_trajectory_tokens: int = Field(6000, alias="maxTrajectoryTokens", ge=200, le=200000, description=(
        "Token budget of the episode log shown to the judge; longer episodes lose middle steps, said so."))
    reasoning: bool | None = Field(None, description=(
        "OpenAI reasoning-model request shape (max_completion_tokens, no temperature), as the paper's "
        "GPT-5 judge needs; unset: decided by the model's name (awm.judge)."))
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, alias="reasoningEffort", description="The reasoning model's effort (unset: the endpoint's default).")

    def env(self) -> list[dict[str, Any]]:
        env: list[dict[str, Any]] = [
            {"name": _names.AWM_JUDGE_BASE_URL, "value": self.base_url},
            {"name": _names.AWM_JUDGE_MODEL, "value": self.model},
            {"name": _names.AWM_JUDGE_VOTES, "value": str(self.votes)},
            {"name": _names.AWM_JUDGE_TIMEOUT_S, "value": str(self.timeout_seconds)},
            {"name": _names.AWM_JUDGE_MAX_TRAJECTORY_TOKENS, "value": str(self.max_trajectory_tokens)}]
        if self.reasoning is not None:
            env.append({"name": _names.AWM_JUDGE_REASONING, "value": "1" if self.reasoning else "0"})
        if self.reasoning_effort:
            env.append({"name": _names.AWM_JUDGE_REASONING_EFFORT, "value": self.reasoning_effort})
        if self.api_key_secret is not None:
            env.append({"name": _names.AWM_JUDGE_API_KEY, "valueFrom": {"secretKeyRef": {
                "name": self.api_key_secret.name, "key": self.api_key_secret.key}}})
        return env


class Serving(_Spec):
    """How tasks are verified and which are served (shared by EnvFleet and Campaign)."""

    judge: JudgeSpec | None = Field(None, description="LLM judge for tasks whose verifier is of kind judge.")
    verifier_kind: Literal["code", "judge"] | None = Field(None, alias="verifierKind", description=(
        "Where a task has both kinds of verifier (AWM imports), serve this one (default: the bundle's primary)."))
    allow_ungated: bool = Field(False, alias="allowUngated", description=(
        "Also serve tasks that have not passed both gates (`awm catalog validate --record`); their "
        "episodes are marked ungated. Off by default."))

    def env(self) -> list[dict[str, Any]]:
        env = self.judge.env() if self.judge else []
        if self.verifier_kind:
            env.append({"name": _names.AWM_VERIFIER_KIND, "value": self.verifier_kind})
        if self.allow_ungated:
            env.append({"name": _names.AWM_ALLOW_UNGATED, "value": "1"})
        return env


class PodOverrides(_Spec):
    image: str | None = Field(None, description="Env-server image (default: the chart's).")
    runtime_class_name: str | None = Field(None, alias="runtimeClassName", description=(
        "RuntimeClass of env pods, e.g. gVisor or Kata for hostile code at scale (default: the chart's "
        "envserver.runtimeClassName)."))
    resources: dict[str, Any] | None = Field(None, description="Container resources (requests/limits).")
    node_selector: dict[str, str] | None = Field(None, alias="nodeSelector")
    tolerations: list[dict[str, Any]] | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


def binding_of(binding: str | None, catalog_url: str | None) -> str:
    """An EnvFleet's binding: as its spec gives it, else late, the fleet sized by concurrent
    episodes (issue 22's default path), except over catalog.url, which late binding does not
    support yet. _BINDING_CEL is the same rule for the API server's validation."""
    return binding or ("pinned" if catalog_url else "late")


_BINDING_CEL = "(has({s}.binding) ? {s}.binding : (has({s}.catalog.url) ? 'pinned' : 'late'))"


class EnvFleetSpec(_Spec):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", json_schema_extra={"x-kubernetes-validations": [
        {"rule": "(has(self.environments) && size(self.environments) > 0) != has(self.environmentSelector)",
         "message": "give either environments or environmentSelector"},
        {"rule": "!has(self.environmentSelector) || has(self.catalog.url) || has(self.catalog.indexConfigMap)",
         "message": "an environmentSelector needs catalog.url or catalog.indexConfigMap (the catalog's index)"},
        {"rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
         "message": "minReplicas must not exceed maxReplicas"},
        {"rule": "!has(self.binding) || self.binding != 'late' || !has(self.catalog.url)",
         "message": "binding: late needs an image catalog (catalog.url is not supported with it yet)"},
        {"rule": f"{_BINDING_CEL.format(s='self')} == {_BINDING_CEL.format(s='oldSelf')}",
         "message": "binding cannot change on an existing fleet (its pods were made for the other kind; "
                    "without spec.binding, a fleet is late with an image catalog and pinned with catalog.url)"}]})

    environments: list[str] = Field(default_factory=list, description="Environment names in the catalog; "
                                    "instances are spread evenly across them, except that waiting claims for "
                                    "one environment or of GRPO groups get their instances where they need them.")
    environment_selector: EnvironmentSelector | None = Field(None, alias="environmentSelector", description=(
        "Instead of environments: the catalog's environments whose names match (status.environments "
        "shows which)."))
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS, description="Desired instances (set by the autoscaler "
                          "when autoscaling is on).")
    buffer: int = Field(0, ge=0, le=MAX_REPLICAS, description="Ready, unallocated instances to keep warm.")
    min_replicas: int = Field(0, alias="minReplicas", ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(MAX_REPLICAS, alias="maxReplicas", ge=0, le=MAX_REPLICAS)
    autoscale: bool = Field(False, description="Replicas = allocated + pending claims + buffer, "
                            "within [minReplicas, maxReplicas].")
    binding: Literal["pinned", "late"] | None = Field(None, description=(
        "late (the default with an image catalog): every pod serves any of the fleet's environments, "
        "switched to the one a claim asks for (a fresh database of it from the pod's provisioner "
        "sidecar; the last few stay ready), so the fleet is sized by concurrent episodes, not "
        "environments x groups. pinned (the default with catalog.url, which late binding does not "
        "support yet): a pod serves the environment it was created for, and needs no provisioner "
        "sidecar."))
    cache_environments: int = Field(4, alias="cacheEnvironments", ge=1, le=64, description=(
        "binding: late - environments each pod keeps ready (its database and bundle) besides the "
        "one it serves: a repeat claim of one, or of one made ready ahead (the allocation API's "
        "prepare), costs a reset instead of a switch. Each costs the pod a few MB and an open "
        "connection on its Postgres shard."))
    spare_databases: int = Field(64, alias="spareDatabases", ge=0, le=1024, description=(
        "binding: late - databases the fleet keeps made ahead on each Postgres shard for any of its "
        "pods: one of each environment claimed recently, the oldest dropped beyond this many. A switch "
        "to an environment with a spare takes it (a rename) instead of cloning on the claim path. "
        "Each costs the shard's disk the size of the environment's database (a few MB); 0: none."))
    catalog: CatalogSource
    database: DatabaseRef
    template: PodOverrides = Field(default_factory=PodOverrides)
    security: FleetSecurity = Field(default_factory=FleetSecurity)
    serving: Serving = Field(default_factory=Serving, description="Judge, verifier kind and task gates.")

    @model_validator(mode="after")
    def _consistent(self) -> "EnvFleetSpec":
        weakening = [k for k, v in (self.template.annotations or {}).items()
                     if k.startswith(WEAKENING_ANNOTATIONS) and str(v).lower() == "unconfined"]
        if weakening and not self.security.allow_weaker_isolation:
            raise ValueError(f"template annotations {weakening} unconfine the env server; set "
                             "security.allowWeakerIsolation: true to allow weaker isolation explicitly")
        if bool(self.environments) == (self.environment_selector is not None):
            raise ValueError("give either environments or environmentSelector")
        if self.environment_selector is not None and not (self.catalog.url or self.catalog.index_config_map):
            raise ValueError("an environmentSelector needs catalog.url or catalog.indexConfigMap (the catalog's index)")
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        if self.binding == "late" and self.catalog.url:
            raise ValueError("binding: late needs an image catalog (catalog.url is not supported with it yet)")
        return self

    @property
    def late(self) -> bool:
        return binding_of(self.binding, self.catalog.url) == "late"


class ObjectStatus(_Spec):
    """A kind's status, as the operator writes it: every writer builds one of these (never a raw
    dict), so a misspelt field, a phase that is not one of the kind's or a condition without a
    status fails in the operator, not as a status the API server prunes without a word. Only the
    fields given are written (a merge patch): a progress report does not reset the phase."""

    @classmethod
    def read(cls, status: Mapping[str, Any] | None) -> Self:
        """A status as the API server returns it, as this model: what the operator reads back
        (its own earlier writes, another replica's). A field the model does not know (another
        writer's) is dropped, and so is one whose value is not the model's (an older operator's
        phase): that field then reads as its default. Never raises on what is stored."""
        known = _known(cls, dict(status or {}))
        for _ in range(len(known) + 1):
            try:
                return cls.model_validate(known)
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
                if not bad & set(known):
                    break
                known = {k: v for k, v in known.items() if k not in bad}
        return cls()

    def patch(self) -> dict[str, Any]:
        """The JSON merge patch of ``status``: the fields set, by their API names. A field set to
        None is written as null, which removes it; inside items (conditions, instances, shards)
        a None is left out, as the API server would store it."""
        fields = type(self).model_fields
        return {(fields[n].alias or n): _plain(getattr(self, n)) for n in fields if n in self.model_fields_set}


def _known(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with only the fields ``model`` has (by their API names), items of nested models
    (conditions, shards, instances) likewise."""
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            continue
        item = _item_model(field.annotation)
        if item is not None and isinstance(value, list):
            value = [_known(item, v) if isinstance(v, dict) else v for v in value]
        out[key] = value
    return out


def _item_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a ``list[Model]`` field, else None."""
    args = getattr(annotation, "__args__", ())
    if getattr(annotation, "__origin__", None) is list and args and isinstance(args[0], type) \
            and issubclass(args[0], BaseModel):
        return args[0]
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class Condition(_Spec):
    """metav1.Condition's fields (built by conditions.py)."""
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = Field(None, alias="lastTransitionTime")
    observed_generation: int | None = Field(None, alias="observedGeneration")


class ShardStatus(_Spec):
    name: str = Field(description="`default` for the Secret's key `dsn`, `<name>` for `dsn-<name>`.")
    state: ShardState = Field(description=(
        "Lost: down for longer than the operator tolerates; its pods are replaced on other shards."))
    instances: int = Field(0, description="Pods of this fleet whose databases live on the shard.")
    max_connections: int | None = Field(None, alias="maxConnections")
    message: str = ""


class EnvFleetStatus(ObjectStatus):
    replicas: int = 0
    ready: int = 0
    allocated: int = 0
    selector: str = Field("", description="Label selector of the fleet's pods (scale subresource).")
    environments: list[str] | None = Field(None, description="The environments an environmentSelector chose.")
    shards: list[ShardStatus] = Field(default_factory=list, description=(
        "The Postgres shards of spec.database.secretName, as last probed."))
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int = Field(0, alias="observedGeneration")


class EnvClaimSpec(_Spec):
    # A bound claim is not re-bound when its spec changes: refuse edits instead of ignoring them.
    model_config = ConfigDict(populate_by_name=True, extra="forbid", json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self == oldSelf", "message": "an EnvClaim's spec cannot change: delete it and create another"}]})

    fleet: str = Field(description="EnvFleet to claim from (same namespace).")
    count: int = Field(1, ge=1, le=MAX_REPLICAS, description="Instances to bind.")
    environment: str | None = Field(None, description="Only instances of this environment.")
    group_size: int | None = Field(None, alias="groupSize", ge=1, le=MAX_REPLICAS, description=(
        "GRPO: bind count/groupSize groups, each of groupSize instances of one environment."))
    ttl_seconds: int | None = Field(None, alias="ttlSeconds", ge=1, le=7 * 86400, description=(
        "Release the instances this long after binding (phase Expired), so a claim whose user "
        "crashed does not hold them forever. Unset: held until the EnvClaim is deleted."))


class EnvClaimStatus(ObjectStatus):
    phase: ClaimPhase = Field(ClaimPhase.PENDING, description=(
        "Degraded: bound, but some instances were lost (pod deleted, evicted or failed). Expired: "
        "ttlSeconds ran out and the instances went back to the pool."))
    message: str = ""
    instances: list[ClaimedInstance] = Field(default_factory=list)
    lost: list[str] = Field(default_factory=list, description="Pods of lost instances.")
    bound_at: str | None = Field(None, alias="boundAt")
    latency_ms: float | None = Field(None, alias="latencyMs", description="Creation to Bound.")
    conditions: list[Condition] = Field(default_factory=list, description=(
        "Bound (reasons Waiting, Bound, Failed, Expired) and Degraded (InstancesLost)."))
    observed_generation: int = Field(0, alias="observedGeneration")


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn a pydantic JSON Schema into a Kubernetes structural schema: refs inlined, nullable
    instead of anyOf-null, no titles, free-form objects marked as such."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _structural(merged, defs)
    out: dict[str, Any] = {}
    any_of = schema.get("anyOf")
    if any_of:
        options = [o for o in any_of if o.get("type") != "null"]
        if len(options) == 1:
            inner = _structural(options[0], defs)
            inner["nullable"] = True
            for key in ("description", "default"):
                if key in schema and schema[key] is not None:
                    inner[key] = schema[key]
            return inner
    for key, value in schema.items():
        if key in ("title", "$defs", "anyOf"):
            continue
        if key == "properties":
            out[key] = {name: _structural(prop, defs) for name, prop in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "additionalProperties":
            if value is False:
                continue
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            else:
                out[key] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "default" in out and out["default"] is None:
        del out["default"]
    return out


def openapi(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    return _structural(schema, schema.get("$defs", {}))


def _crd(kind: str, plural: str, short: str, spec: type[BaseModel], status: type[BaseModel],
         columns: list[dict[str, Any]], scale: bool) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                                 "labelSelectorPath": ".status.selector"}
    root = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": openapi(spec), "status": openapi(status)}, "required": ["spec"]}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "shortNames": [short],
                           "listKind": f"{kind}List", "categories": ["awm"]},
                 "versions": [{"name": VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": root},
                               "subresources": subresources, "additionalPrinterColumns": columns}]},
    }


def definitions() -> list[dict[str, Any]]:
    age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    return [
        _crd("EnvFleet", "envfleets", "ef", EnvFleetSpec, EnvFleetStatus, [
            {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.ready"},
            {"name": "Allocated", "type": "integer", "jsonPath": ".status.allocated"},
            {"name": "Environments", "type": "string", "jsonPath": ".spec.environments", "priority": 1},
            age], scale=True),
        _crd("EnvClaim", "envclaims", "ec", EnvClaimSpec, EnvClaimStatus, [
            {"name": "Fleet", "type": "string", "jsonPath": ".spec.fleet"},
            {"name": "Count", "type": "integer", "jsonPath": ".spec.count"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Latency-ms", "type": "number", "jsonPath": ".status.latencyMs", "priority": 1},
            age], scale=False),
        campaign_definition(),
    ]


# --------------------------------------------------------------------------- Campaign
#
# A Campaign is one training or evaluation run on the cluster: the operator creates an EnvFleet
# sized to the run's demand and a Job that runs `awm train` or `awm eval` against it, follows the
# Job, shows the run's progress in the status and deletes the fleet when the Job is done.

DEFAULT_GROUP_SIZE = 4


def _campaign_rules() -> list[dict[str, str]]:
    """CEL rules the API server checks on create, so an impossible campaign is refused at once
    instead of failing later in the operator (pydantic's validators are not in the schema)."""
    group = (f"(self.mode == 'training' ? (has(self.training) && has(self.training.groupSize) ? "
             f"self.training.groupSize : {DEFAULT_GROUP_SIZE}) : self.mode == 'evaluation' ? "
             f"(has(self.evaluation) && has(self.evaluation.k) ? self.evaluation.k : {DEFAULT_GROUP_SIZE}) : "
             f"(has(self.external) && has(self.external.groupSize) ? self.external.groupSize : 1))")
    return [
        {"rule": "self.mode == 'training' ? (has(self.training) && !has(self.evaluation) && !has(self.external)) "
                 ": self.mode == 'evaluation' ? (has(self.evaluation) && !has(self.training) && !has(self.external)) "
                 ": (has(self.external) && !has(self.training) && !has(self.evaluation))",
         "message": "each mode needs its own section (training, evaluation or external) and no other"},
        {"rule": "self.mode != 'external' || (has(self.job) && has(self.job.command) && size(self.job.command) > 0)",
         "message": "mode external needs job.command (the trainer to run)"},
        {"rule": f"has(self.concurrentGroups) || self.environments.size() * self.groupsPerEnvironment * {group} "
                 f"<= {MAX_REPLICAS}",
         "message": f"environments x groupsPerEnvironment x group size must be at most {MAX_REPLICAS} (or set "
                    "concurrentGroups: a late-binding fleet sized by concurrent episodes)"},
        {"rule": f"!has(self.concurrentGroups) || self.concurrentGroups * {group} <= {MAX_REPLICAS}",
         "message": f"concurrentGroups x group size (the concurrent episodes) must be at most {MAX_REPLICAS}"},
        {"rule": "!has(self.concurrentGroups) || !has(self.groupsPerEnvironment) || self.groupsPerEnvironment == 1",
         "message": "give concurrentGroups or groupsPerEnvironment, not both"},
        {"rule": "!has(self.concurrentGroups) || !has(self.catalog.url)",
         "message": "concurrentGroups (late binding) needs an image catalog"},
        {"rule": "!has(self.cacheEnvironments) || has(self.concurrentGroups)",
         "message": "cacheEnvironments is for a late-binding fleet: set concurrentGroups"},
    ]


class CampaignJob(_Spec):
    """The Job's pod: the trainer image and what a GPU run needs (resources, placement)."""

    image: str | None = Field(None, description="Trainer image (default: the chart's trainer.image).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(None, alias="imagePullPolicy")
    command: list[str] | None = Field(None, description="Container command (default: [awm]).")
    args: list[str] | None = Field(None, description=(
        "Container arguments (default: `train --config <rendered config>` or `eval ...` from the spec)."))
    resources: dict[str, Any] | None = Field(None, description=(
        "Container resources; e.g. limits: {nvidia.com/gpu: 1} for training."))
    env: list[dict[str, Any]] | None = Field(None, description="More EnvVars (after the operator's own).")
    node_selector: dict[str, str] | None = Field(None, alias="nodeSelector")
    tolerations: list[dict[str, Any]] | None = None
    backoff_limit: int = Field(0, alias="backoffLimit", ge=0, le=100, description=(
        "Pod retries before the Job, and so the campaign, fails (a retried trainer resumes from its "
        "run directory's last checkpoint when that is on a volume)."))
    active_deadline_seconds: int | None = Field(None, alias="activeDeadlineSeconds", ge=1)
    service_account_name: str | None = Field(None, alias="serviceAccountName")
    labels: dict[str, str] | None = Field(None, description="Extra labels of the Job's pod.")
    annotations: dict[str, str] | None = Field(None, description="Extra annotations of the Job's pod.")
    volumes: list[dict[str, Any]] | None = Field(None, description="Extra pod volumes (models, run directory).")
    volume_mounts: list[dict[str, Any]] | None = Field(None, alias="volumeMounts")


class LearnerProcesses(_Spec):
    """The learner over several GPUs and nodes: ``awm train`` under torchrun with an FSDP2-sharded
    learner (``learner.distributed``, docs/training.md). Rank 0 runs the rollouts."""

    processes_per_node: int = Field(1, alias="processesPerNode", ge=1, le=64, description=(
        "torchrun --nproc-per-node: learner processes per pod, one per GPU the trainer container gets."))
    nodes: int = Field(1, ge=1, le=64, description=(
        "Pods of the learner, one per node: an Indexed Job whose pods meet at the first one through a "
        "headless Service (torchrun --nnodes, --node-rank from the completion index)."))
    port: int = Field(29500, ge=1024, le=65535, description="torchrun's rendezvous port on the first pod.")

    @property
    def processes(self) -> int:
        return self.processes_per_node * self.nodes


class VllmSidecar(_Spec):
    """A vLLM server beside the learner in the trainer's pod (a native sidecar: started and
    healthy before the trainer, stopped when it exits). The operator sets what the weight sync
    needs (the model and name from training.config.policy, tool parsing, sampling log-probs,
    LoRA or reload endpoints) and points policy.base_url at it; the weights travel through an
    emptyDir both containers mount (policy.sync_dir)."""

    image: str = Field(description="A vLLM image, e.g. vllm/vllm-openai (its python runs the server).")
    args: list[str] | None = Field(None, description=(
        "More server flags, e.g. [--tensor-parallel-size, \"4\", --gpu-memory-utilization, \"0.85\"]."))
    resources: dict[str, Any] | None = Field(None, description=(
        "The server's resources, e.g. limits: {nvidia.com/gpu: 4} (the trainer's are job.resources)."))
    port: int = Field(8000, ge=1024, le=65535)
    env: list[dict[str, Any]] | None = Field(None, description="More EnvVars of the server.")


class TrainingSpec(_Spec):
    group_size: int = Field(DEFAULT_GROUP_SIZE, alias="groupSize", ge=1, le=MAX_REPLICAS,
                            description="GRPO group size: episodes of one task compared with each other.")
    config: dict[str, Any] = Field(default_factory=dict, description=(
        "The `awm train` configuration (docs/training.md), rendered into a ConfigMap the Job reads. "
        "The campaign sets catalog, envs, replicas and rollout.group_size from its own fields."))
    learner: LearnerProcesses = Field(default_factory=LearnerProcesses, description=(
        "Learner processes per pod and pods (torchrun, FSDP2); the default is one process."))
    vllm: VllmSidecar | None = Field(None, description=(
        "A vLLM server in the trainer's pod for policy.kind vllm (one node; with several, run vLLM as "
        "its own Deployment and give policy.base_url and a shared policy.sync_dir)."))


class EvaluationSpec(_Spec):
    base_url: str = Field(alias="baseUrl", description="OpenAI-compatible endpoint of the model (…/v1).")
    model: str = Field(description="Model name at that endpoint.")
    api_key_secret: SecretKeyRef | None = Field(None, alias="apiKeySecret", description=(
        "API key of the endpoint, passed to the evaluator as AWM_POLICY_API_KEY."))
    k: int = Field(DEFAULT_GROUP_SIZE, ge=1, le=MAX_REPLICAS, description="Samples per task (pass@k).")
    tasks: list[str] | None = Field(None, description="Only these task ids (default: every task).")
    max_turns: int = Field(30, alias="maxTurns", ge=1, le=1000)
    tool_format: Literal["native", "text"] = Field("native", alias="toolFormat")
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    output: str = Field("/tmp/eval", pattern=r"^/", description=(
        "Directory of eval.json, eval.png and the trajectories. The default is the pod's scratch "
        "space, gone with the pod: mount a volume (job.volumes, job.volumeMounts) and point this "
        "into it to keep them."))


class ExternalSpec(_Spec):
    """A trainer of your own (TRL, verl, SkyRL, ...) in ``job.image`` / ``job.command``: the
    operator makes the fleet and runs the Job with the fleet's allocation endpoint and the Job's
    credentials in its environment (AWM_OPERATOR_URL, AWM_NAMESPACE, AWM_FLEET, AWM_CAMPAIGN, and
    the ServiceAccount token the AllocationClient sends)."""

    group_size: int = Field(1, alias="groupSize", ge=1, le=MAX_REPLICAS, description=(
        "Instances per group the trainer claims at once (the fleet holds environments x "
        "groupsPerEnvironment x groupSize)."))


class CampaignCleanup(_Spec):
    delete_fleet: bool = Field(True, alias="deleteFleet", description=(
        "Delete the EnvFleet when the campaign finishes (its pods and databases go with it)."))


class CampaignSpec(_Spec):
    model_config = ConfigDict(populate_by_name=True, extra="forbid",
                              json_schema_extra={"x-kubernetes-validations": _campaign_rules()})

    mode: Literal["training", "evaluation", "external"] = Field(description=(
        "training: `awm train`; evaluation: `awm eval`; external: your own trainer (job.command)."))
    environments: list[str] = Field(min_length=1, description="Environment names in the catalog.")
    groups_per_environment: int = Field(1, alias="groupsPerEnvironment", ge=1, le=MAX_REPLICAS, description=(
        "Groups running at once per environment. The fleet holds environments x groupsPerEnvironment "
        "x group size instances (training.groupSize, or evaluation.k)."))
    concurrent_groups: int | None = Field(None, alias="concurrentGroups", ge=1, le=MAX_REPLICAS, description=(
        "Instead of groupsPerEnvironment: groups running at once across all environments. The fleet "
        "binds environments late (EnvFleet binding: late) and holds concurrentGroups x group size "
        "instances whatever the number of environments: the paper's step of 64 groups of 16 over "
        "526 environments is 1,024 instances, not 8,416."))
    cache_environments: int | None = Field(None, alias="cacheEnvironments", ge=1, le=64, description=(
        "With concurrentGroups: environments each of the fleet's pods keeps ready besides the one it "
        "serves (EnvFleet cacheEnvironments, default 4). More of them make a repeat claim of an "
        "environment a reset more often, at a few MB and a Postgres connection each."))
    catalog: CatalogSource
    database: DatabaseRef
    fleet_template: PodOverrides = Field(default_factory=PodOverrides, alias="fleetTemplate",
                                         description="The env pods' template (EnvFleet.spec.template).")
    job: CampaignJob = Field(default_factory=CampaignJob)
    training: TrainingSpec | None = None
    evaluation: EvaluationSpec | None = None
    external: ExternalSpec | None = None
    serving: Serving = Field(default_factory=Serving, description=(
        "Judge, verifier kind and task gates of the campaign's fleet (and of its trainer's task choice)."))
    cleanup: CampaignCleanup = Field(default_factory=CampaignCleanup)

    @property
    def group_size(self) -> int:
        if self.mode == "training":
            return self.training.group_size if self.training else DEFAULT_GROUP_SIZE
        if self.mode == "external":
            return self.external.group_size if self.external else 1
        return self.evaluation.k if self.evaluation else DEFAULT_GROUP_SIZE

    @property
    def instances_per_environment(self) -> int:
        return self.groups_per_environment * self.group_size

    @property
    def late(self) -> bool:
        return self.concurrent_groups is not None

    @property
    def instances(self) -> int:
        """Instances the campaign's fleet holds: concurrent episodes (late binding), or one set
        per environment."""
        if self.concurrent_groups is not None:
            return self.concurrent_groups * self.group_size
        return len(self.environments) * self.instances_per_environment

    @model_validator(mode="after")
    def _consistent(self) -> "CampaignSpec":
        sections = {"training": self.training, "evaluation": self.evaluation, "external": self.external}
        others = [k for k, v in sections.items() if v is not None and k != self.mode]
        if sections[self.mode] is None or others:
            raise ValueError(f"mode {self.mode} needs spec.{self.mode}" + (f" and no spec.{', spec.'.join(others)}"
                                                                         if others else ""))
        if self.mode == "external" and not self.job.command:
            raise ValueError("mode external needs job.command (the trainer to run)")
        if self.training is not None and self.training.vllm is not None:
            if self.training.learner.nodes > 1:
                raise ValueError("training.vllm runs in the trainer's pod: with several nodes run vLLM as its own "
                                 "Deployment (policy.base_url, a shared policy.sync_dir)")
            if (self.training.config.get("policy") or {}).get("kind") != "vllm":
                raise ValueError("training.vllm needs training.config.policy.kind vllm")
        if self.concurrent_groups is None and self.cache_environments is not None:
            raise ValueError("cacheEnvironments is for a late-binding fleet: set concurrentGroups")
        if self.concurrent_groups is not None:
            if self.groups_per_environment != 1:
                raise ValueError("give concurrentGroups or groupsPerEnvironment, not both")
            if self.catalog.url:
                raise ValueError("concurrentGroups (late binding) needs an image catalog")
            if self.instances > MAX_REPLICAS:
                raise ValueError(f"the campaign needs {self.instances} instances (concurrentGroups x group size); "
                                 f"at most {MAX_REPLICAS}")
        elif self.instances > MAX_REPLICAS:
            raise ValueError(f"the campaign needs {self.instances} instances (environments x groupsPerEnvironment "
                             f"x group size); at most {MAX_REPLICAS}; set concurrentGroups to size it by "
                             "concurrent episodes (late binding)")
        return self


class CampaignStatus(ObjectStatus):
    phase: CampaignPhase = Field(CampaignPhase.PENDING, description=(
        "Pending -> Running -> Succeeded | Failed; it only moves forward."))
    message: str = ""
    fleet: str = Field("", description="The campaign's EnvFleet.")
    job: str = Field("", description="The campaign's Job.")
    instances: int = Field(0, description="Instances the fleet holds for the campaign.")
    step: int | None = Field(None, description="Training step (evaluation: tasks finished), as reported.")
    reward_mean: float | None = Field(None, alias="rewardMean")
    rollouts_per_s: float | None = Field(None, alias="rolloutsPerS")
    pass_rates: dict[str, float] = Field(default_factory=dict, alias="passRates",
                                         description="pass@1 per environment (evaluation).")
    pass_at_k: dict[str, float] = Field(default_factory=dict, alias="passAtK",
                                        description="pass@k per environment, k = evaluation.k (evaluation).")
    started_at: str | None = Field(None, alias="startedAt")
    finished_at: str | None = Field(None, alias="finishedAt")
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int = Field(0, alias="observedGeneration")


def campaign_definition() -> dict[str, Any]:
    age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    return _crd("Campaign", "campaigns", "camp", CampaignSpec, CampaignStatus, [
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Reward", "type": "number", "jsonPath": ".status.rewardMean"},
        {"name": "Fleet", "type": "string", "jsonPath": ".status.fleet", "priority": 1},
        age], scale=False)
