"""The worker protocol's wire format: one JSON object per line, with tagged values.

SQL parameters and rows cross the pipe between the server and a worker. Plain JSON would turn a
``datetime`` into a string and a ``Decimal`` into a float, and SQLAlchemy apps in the worker expect
the Python types psycopg returns; so the non-JSON types travel as ``{"$t": tag, "v": text}``.
Both sides decode with the same table: nothing is ever unpickled or evaluated.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from dataclasses import dataclass
from typing import Any

@dataclass(frozen=True)
class JsonParam:
    """A JSON/JSONB query parameter (SQLAlchemy wraps them); the server adapts it for psycopg."""

    obj: Any
    binary: bool


_DECODERS: dict[str, Any] = {
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(seconds=float(v)),
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
    "bytes": base64.b64decode,
    "json": lambda v: JsonParam(v, False),
    "jsonb": lambda v: JsonParam(v, True),
}


def _tag(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return {"$t": "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$t": "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$t": "time", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$t": "timedelta", "v": repr(value.total_seconds())}
    if isinstance(value, decimal.Decimal):
        return {"$t": "decimal", "v": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$t": "uuid", "v": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$t": "bytes", "v": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, JsonParam):
        return {"$t": "jsonb" if value.binary else "json", "v": value.obj}
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"cannot send a {type(value).__name__} over the worker protocol")


def _untag(obj: dict[str, Any]) -> Any:
    tag = obj.get("$t")
    if tag is not None and len(obj) == 2 and "v" in obj:
        decoder = _DECODERS.get(tag)
        if decoder is None:
            raise ValueError(f"unknown tagged value {tag!r}")
        return decoder(obj["v"])
    return obj


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, default=_tag, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line, object_hook=_untag)
    if not isinstance(message, dict):
        raise ValueError("a protocol message must be a JSON object")
    return message
