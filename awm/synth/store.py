"""Resumable JSONL stage files.

A stage reads its input file and appends one record per finished item to its output file,
flushed and fsynced, keyed by the item's key. A restarted stage skips keys already present, so an
interrupted run continues where it stopped and never writes a duplicate; a stage never opens its
input for writing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (run the previous stage first)")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if number == len(path.read_text().splitlines()):
                    break  # a torn last line from an interrupted write: redone on resume
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
    return records


class StageOutput:
    """Append-only, keyed, crash-safe output of one stage."""

    def __init__(self, path: Path, key: Callable[[dict[str, Any]], str], inputs: list[Path] = ()) -> None:  # type: ignore[assignment]
        for source in inputs:
            if source.resolve() == path.resolve():
                raise ValueError(f"output {path} is also an input: a stage never overwrites its input")
        self.path = path
        self._key = key
        self.done: dict[str, dict[str, Any]] = {}
        if path.exists():
            for record in read_jsonl(path):
                self.done.setdefault(key(record), record)  # first record wins, as on disk
            self._rewrite_if_torn()

    def _rewrite_if_torn(self) -> None:
        text = self.path.read_text()
        if text and not text.endswith("\n"):
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.done.values()))

    def __contains__(self, key: str) -> bool:
        return key in self.done

    def append(self, record: dict[str, Any]) -> None:
        key = self._key(record)
        if key in self.done:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.done[key] = record

    def records(self) -> Iterator[dict[str, Any]]:
        return iter(self.done.values())
