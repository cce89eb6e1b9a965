"""How a fleet's allocation ledger is split over ConfigMaps: their names, and which one a claim
goes to. Pure functions; the I/O is ``ledger.py``.

Why shards: a ConfigMap holds at most 1 MiB of data (key and value bytes; the API server refuses
more), and one claim record costs 100 to 800 bytes (pod names, the caller's identity, a holder of
up to 253 characters). A fleet of 4,096 instances, each held by a claim of its own, needs up to
about 3 MB. Size matters far below the limit too: every ledger write makes the API server decode,
patch and re-encode the whole object, and etcd stores all of it again as a new version, kept until
the API server compacts (every 5 minutes). With one 800 KB ledger (4,096 claims, bench/fleet.py)
releasing the claims one write each filled etcd's 2 GiB quota ("mvcc: database space exceeded")
and the control plane refused every write after that. Shards of 64 KiB make a write cost at most
64 KiB, whatever the fleet's size.

So the ledger is ``<fleet>-claims`` (the only shard while the claims fit, as before shards
existed), then ``<fleet>-claims-1``, ``-2``, ... A claim lives whole in one shard, so binding it is
still one atomic write. A new claim goes to the first shard with room for it (first fit: shards
fill from the first, and a shard emptied by releases takes new claims again); changes to a claim
go to the shard that holds it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from awm import settings

CONFIGMAP_LIMIT = 1024 * 1024       # bytes of keys and values the API server accepts in one ConfigMap
# New claims go to a shard while it holds less than this (64 KiB; the operator's
# OperatorConfig.ledger_shard_bytes, AWM_LEDGER_SHARD_BYTES, overrides it).
SHARD_BYTES: int = settings.var.AWM_LEDGER_SHARD_BYTES.default


def shard_name(fleet: str, index: int) -> str:
    """``<fleet>-claims`` for the first shard, ``<fleet>-claims-<index>`` for the others; a fleet
    name near the 253-character limit gets a hashed tail."""
    suffix = "-claims" if index == 0 else f"-claims-{index}"
    name = fleet + suffix
    if len(name) <= 253:
        return name
    return f"{fleet[:230]}-{hashlib.sha256(fleet.encode()).hexdigest()[:8]}{suffix}"


def shard_index(fleet: str, name: str) -> int | None:
    """The index of ``name`` if it is one of ``fleet``'s shards, else None."""
    base = shard_name(fleet, 0)
    if name == base:
        return 0
    match = re.fullmatch(r"(.*)-claims-([1-9][0-9]*)", name)
    if match is None:
        return None
    index = int(match.group(2))
    return index if shard_name(fleet, index) == name else None


def entry_size(claim_id: str, text: str) -> int:
    """What one claim counts against a ConfigMap's limit: its key and value, in bytes."""
    return len(claim_id.encode()) + len(text.encode())


def place(used: Sequence[int], size: int, limit: int = SHARD_BYTES) -> int:
    """The shard for a new claim of ``size`` bytes, given each shard's bytes in use: the first one
    it fits in, or an empty one whatever its size (one claim may exceed the soft limit), else a
    new shard at the end."""
    for index, n in enumerate(used):
        if n == 0 or n + size <= limit:
            return index
    return len(used)
