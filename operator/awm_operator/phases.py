"""The operator's status words, each spelled once: its kinds' phases, condition types and reasons.

Every status writer (reconcile.py, handlers.py, campaigns.py) and reader (the API's listings, the
metrics, ``crds.py``'s schemas) takes them from here, so a phase added is a phase the CRD's
schema accepts, the metrics export and the readers know; ``tests/test_phases.py`` fails when one
of these words is spelled as a literal anywhere else in the operator. They are ``StrEnum``: a
member is the string the API server stores, so a status read back as JSON compares equal.

Kubernetes' own words (a Pod's phase, a Job's conditions) are not here: they are its, read as it
writes them.
"""

from __future__ import annotations

from enum import StrEnum


class ClaimPhase(StrEnum):
    """An EnvClaim's ``status.phase``."""

    PENDING = "Pending"    # waiting for enough ready instances
    BOUND = "Bound"        # holds its instances
    DEGRADED = "Degraded"  # bound, but some instances were lost (pod deleted, evicted or failed)
    FAILED = "Failed"      # can never be bound as asked (invalid spec, unknown environment)
    EXPIRED = "Expired"    # ttlSeconds ran out: the instances went back to the pool


# Phases a claim's binding task has ended in: the operator does not bind it again on a restart.
CLAIM_SETTLED = frozenset({ClaimPhase.BOUND, ClaimPhase.DEGRADED, ClaimPhase.FAILED, ClaimPhase.EXPIRED})


class CampaignPhase(StrEnum):
    """A Campaign's ``status.phase``; it only moves forward (:func:`campaign_advances`)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


CAMPAIGN_TERMINAL = frozenset({CampaignPhase.SUCCEEDED, CampaignPhase.FAILED})
_CAMPAIGN_ORDER = {CampaignPhase.PENDING: 1, CampaignPhase.RUNNING: 2, CampaignPhase.SUCCEEDED: 3,
                   CampaignPhase.FAILED: 3}


def campaign_advances(current: str | None, new: str) -> bool:
    """Whether ``new`` is a later phase than ``current`` (None or "": no phase yet). Phases only
    move forward (Pending -> Running -> Succeeded | Failed): a late or repeated event never takes
    a finished campaign back, nor a running one back to Pending."""
    return _CAMPAIGN_ORDER.get(new, 0) > _CAMPAIGN_ORDER.get(current or "", 0)  # type: ignore[call-overload]


class ShardState(StrEnum):
    """A database shard's state in an EnvFleet's ``status.shards``."""

    UNKNOWN = "Unknown"  # not probed yet
    UP = "Up"
    DOWN = "Down"        # unreachable now
    LOST = "Lost"        # unreachable for longer than the fleet waits: its instances are moved


class ConditionType(StrEnum):
    """The ``type`` of a condition the operator writes (metav1.Condition)."""

    READY = "Ready"                            # EnvFleet: every replica up (reasons: FleetReason)
    DATABASE_AVAILABLE = "DatabaseAvailable"   # EnvFleet: its database shards (reasons: ShardReason)
    BOUND = "Bound"                            # EnvClaim (reasons: ClaimReason)
    DEGRADED = "Degraded"                      # EnvClaim: instances lost (reasons: ClaimReason)
    CREATED = "Created"                        # Campaign: its EnvFleet and Job exist
    COMPLETE = "Complete"                      # Campaign: its Job succeeded (reasons: CampaignReason or the Job's)
    FAILED = "Failed"                          # Campaign: it failed (reasons: CampaignReason or the Job's)
    FLEET_DELETED = "FleetDeleted"             # Campaign: its EnvFleet was cleaned up


class FleetReason(StrEnum):
    """Why an EnvFleet is (not) Ready."""

    ALL_READY = "AllReady"
    RECONCILING = "Reconciling"
    INVALID_SPEC = "InvalidSpec"
    CATALOG_INDEX_UNAVAILABLE = "CatalogIndexUnavailable"
    BUNDLE_UNAVAILABLE = "BundleUnavailable"  # a pod cannot fetch its environment's bundle
    PROVISION_FAILED = "ProvisionFailed"      # a pod cannot get its database
    PODS_FAILING = "PodsFailing"
    DATABASE_UNAVAILABLE = "DatabaseUnavailable"


class ShardReason(StrEnum):
    """Why an EnvFleet's databases are (not) available."""

    ALL_SHARDS_UP = "AllShardsUp"
    SECRET_UNREADABLE = "SecretUnreadable"
    PROBING = "Probing"
    SHARD_LOST = "ShardLost"
    SHARD_DOWN = "ShardDown"


class ClaimReason(StrEnum):
    """The reasons of an EnvClaim's Bound and Degraded conditions."""

    WAITING = "Waiting"
    BOUND = "Bound"
    FAILED = "Failed"
    EXPIRED = "Expired"
    NOT_BOUND = "NotBound"
    ALL_INSTANCES = "AllInstances"
    INSTANCES_LOST = "InstancesLost"


class CampaignReason(StrEnum):
    """The operator's own reasons for a Campaign's conditions (a Job's are passed on as it says)."""

    INVALID_SPEC = "InvalidSpec"
    CREATED = "Created"
    NOT_CREATED = "NotCreated"
    CREATE_FAILED = "CreateFailed"
    WAITING = "Waiting"          # for the Job's pod
    POD_READY = "PodReady"
    FINISHED = "Finished"        # the trainer reported the end itself
    JOB_DELETED = "JobDeleted"
    COMPLETED = "Completed"      # the Job's Complete condition gave no reason
    JOB_FAILED = "Failed"        # the Job's Failed condition gave no reason
    CLEANUP = "Cleanup"          # the EnvFleet was deleted with the campaign's end
    KEPT = "Kept"                # spec.cleanup.deleteFleet is false
