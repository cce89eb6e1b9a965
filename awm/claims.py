"""The allocation API's words, typed once: what a trainer asks for, what it gets, and why not.

The operator's API (``awm_operator.api``) validates its request bodies with these models and
answers with them; its clients (:mod:`awm.episode.allocation`, the trainer's and the adapters'
instance sources, the UI's playground) read the answers into them; an EnvClaim's status lists
its instances as :class:`ClaimedInstance` too (``awm_operator.crds``). A field added here is on
the wire, in the CRD's schema and in every client at once; a client that reads a field the
operator does not send fails in ``tests/test_claims.py``, not in a trainer.

On the wire the fields are camelCase (``groupSize``, ``mcpUrl``), as in the CRDs; in Python
they are snake_case. Agones answers an allocation with a typed state (``Allocated``,
``UnAllocated``, ``Contention``); so does this API (:class:`ClaimOutcome`), on its errors too.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator
from pydantic.alias_generators import to_camel

MAX_INSTANCES = 4096  # instances of one fleet (its maxReplicas), and so of one claim, at most
MAX_WAIT_S = 600.0  # a claim's waitSeconds, at most (a longer wait is a retry loop's job)
MAX_ENVIRONMENTS = 2000  # environments one prepare request names, and a fleet's listing shows, at most
CLAIM_ID = re.compile(r"api_[0-9a-f]{16,64}")  # an id a client may choose (to ask again after a lost answer)


class ClaimOutcome(StrEnum):
    """How a claim request ended (Agones' ``GameServerAllocationState``, plus the refusals)."""

    ALLOCATED = "Allocated"      # 201: bound
    UNALLOCATED = "UnAllocated"  # 409: not enough ready instances within waitSeconds
    CONTENTION = "Contention"    # 409: the same id is being bound by another request right now
    REFUSED = "Refused"          # 400: can never be bound as asked (bad request, unknown environment)
    STANDBY = "Standby"          # 503: this operator replica does not act on the fleet; ask again


OUTCOME_STATUS: dict[ClaimOutcome, int] = {
    ClaimOutcome.ALLOCATED: 201, ClaimOutcome.UNALLOCATED: 409, ClaimOutcome.CONTENTION: 409,
    ClaimOutcome.REFUSED: 400, ClaimOutcome.STANDBY: 503}


class Wire(BaseModel):
    """camelCase on the wire, snake_case in Python; an unknown field is an error (a misspelt
    ``groupsize`` must not bind ungrouped instances)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, object]:
        """The JSON object this model is on the wire."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def read(cls, data: object) -> Self:
        """``data`` (a request's or an answer's JSON) as this model; :class:`BadRequest` if it
        is not one, with what is wrong in words."""
        try:
            return cls.model_validate({} if data is None else data)
        except ValidationError as exc:
            raise BadRequest(problems(exc)) from None


class Answer(Wire):
    """An answer read by a client: a field a newer operator sends is ignored, not refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class BadRequest(ValueError):
    """A request body that is not what the API takes (400, outcome Refused)."""


def problems(exc: ValidationError) -> str:
    """A validation error in one line: ``groupSize: Input should be ...; ttlSeconds: ...``."""
    said = []
    for e in exc.errors():
        where, what = ".".join(str(p) for p in e["loc"]), e["msg"].removeprefix("Value error, ")
        said.append(f"{where}: {what}" if where else what)
    return "; ".join(said)


Switch = Literal["operator", "client"]


class ClaimRequest(Wire):
    """POST .../claims: bind ``count`` instances, all-or-nothing, in GRPO groups of ``group_size``
    (each group one environment), of ``environment`` when given."""

    count: int = Field(1, ge=1, le=MAX_INSTANCES)
    group_size: int | None = Field(None, ge=1, le=MAX_INSTANCES)
    environment: str | None = Field(None, min_length=1, max_length=253)
    wait_seconds: float | None = Field(None, ge=0, description=f"None: the operator's default; at most {MAX_WAIT_S:g}")
    ttl_seconds: float | None = Field(None, gt=0, description="None: the operator's default")
    holder: str | None = Field(None, max_length=253, description="who holds it (DELETE ?holder= frees them all)")
    # binding: late - "client": answer at once; the client switches each instance marked
    # switched=false itself (POST <controlUrl>/bind) before its first episode, instead of the
    # operator before it answers: the switches run on the pods, not through the operator.
    switch: Switch = "operator"
    id: str | None = Field(None, pattern=CLAIM_ID.pattern, description="the client's own id: asked again, "
                           "after a lost answer, it returns the claim bound the first time")

    @model_validator(mode="after")
    def _groups_divide(self) -> "ClaimRequest":
        if self.group_size and self.count % self.group_size:
            raise ValueError(f"count ({self.count}) must be a multiple of groupSize ({self.group_size})")
        return self

    @property
    def client_switches(self) -> bool:
        return self.switch == "client"


class ClaimedInstance(Answer):
    """One instance of a claim: where its agent connects and where its trainer resets it."""

    # (one line: the docstring is the CRD's description of EnvClaim status.instances)

    pod: str
    environment: str | None  # None: a lost instance whose pod is gone (nothing says what it served)
    group: int = 0
    mcp_url: str | None = None
    control_url: str | None = None
    # binding: late - False: claimed with switch "client" and still serving another environment;
    # None: not known (a claim read back with GET)
    switched: bool | None = True
    lost: bool = False  # its pod was deleted, evicted or failed since the claim was bound


class Claim(Answer):
    """A claim as the API answers it (POST, GET)."""

    id: str
    namespace: str
    fleet: str
    instances: list[ClaimedInstance] = Field(default_factory=list)
    outcome: ClaimOutcome = ClaimOutcome.ALLOCATED
    expires_at: float | None = None  # unix time the operator releases it by itself; None: never
    holder: str | None = None
    owner: str | None = None  # the authenticated identity that made it
    lost: int = 0
    releasing: bool = False
    latency_ms: float | None = None  # how long the bind took (POST only)


class ClaimRefusal(Answer):
    """The body of every 4xx/5xx answer: the message, and for a claim its outcome."""

    error: str
    outcome: ClaimOutcome | None = None


class RenewRequest(Wire):
    """POST .../claims/{id}/renew: expire ``ttl_seconds`` from now (None: the operator's default)."""

    ttl_seconds: float | None = Field(None, gt=0)


class Renewal(Answer):
    id: str
    expires_at: float | None


class Release(Answer):
    """DELETE .../claims/{id}: answered once the instances are reset. ``replaced``: those whose
    reset failed, deleted (the fleet makes new ones)."""

    id: str
    returned: int
    replaced: int


class HolderRelease(Answer):
    """DELETE .../claims?holder=H: every claim of that holder."""

    holder: str
    released: list[str]
    returned: int
    replaced: int


class PrepareRequest(Wire):
    """binding: late - POST .../prepare: make ``environments`` (name -> instances) ready ahead of
    their claims; ``wait``: answer once made, not once the pods are chosen."""

    environments: dict[str, Annotated[StrictInt, Field(ge=0, le=MAX_INSTANCES)]] = Field(
        min_length=1, max_length=MAX_ENVIRONMENTS)
    wait: bool = Field(False, strict=True)


InstanceState = Literal["starting", "ready", "allocated", "failed", "deleting"]


class FleetInstance(Answer):
    """One instance of a fleet as ``GET .../instances`` lists it (what ``awm ui``'s fleet page shows)."""

    pod: str
    environment: str
    state: InstanceState
    phase: str  # the Pod's phase, as Kubernetes says it
    claim: str | None = None
    holder: str | None = None
    problem: str | None = None  # why it is not ready (a container's waiting reason)
    mcp_url: str | None = None
    control_url: str | None = None


class HeldClaim(Answer):
    """A claim as the fleet's instance listing shows it (its instances are listed by pod)."""

    id: str
    holder: str | None = None
    owner: str | None = None
    instances: int
    groups: int
    age_seconds: float
    expires_in_seconds: float | None = None


class FleetInstances(Answer):
    """``GET .../instances``: every instance of the fleet and every claim on it."""

    namespace: str
    fleet: str
    instances: list[FleetInstance]
    claims: list[HeldClaim]


class Preparation(Answer):
    """What a prepare request did: instances asked, pods chosen (pod -> environment) and, when
    waited for, how many were made, were there already, or failed."""

    namespace: str
    fleet: str
    asked: int
    chosen: int
    pods: dict[str, str] = Field(default_factory=dict)
    prepared: int | None = None
    cached: int | None = None
    failed: int | None = None
