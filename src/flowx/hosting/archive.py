"""Archivers: where the retention sweep keeps an instance before it deletes it (R2.13).

An archiver receives a page of instances, each with every row the journal holds of it (its
steps, signals and events), and must have kept them durably when ``archive`` returns: the
sweep deletes the page only then. If it raises, nothing of that page is deleted.

``JsonlArchiver`` writes one gzip-compressed JSON-lines file per page into a directory: one
line per instance, its rows as the journal holds them. Payload columns (input, state, results,
event payloads) stay the JSON text they were stored as, byte for byte, so an archived instance
can be put back exactly (``read_archive`` reads a file back into records).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import os
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from flowx.errors import FlowXError
from flowx.stores.records import (
    ArchivedInstance,
    EventRecord,
    InstanceRecord,
    InstanceState,
    Outcome,
    SignalRecord,
    StepRecord,
)

#: What ``JsonlArchiver`` writes on each line's ``"format"``: a reader knows what it reads.
ARCHIVE_FORMAT = "flowx-archive/1"


@runtime_checkable
class Archiver(Protocol):
    """**Protocol:** keeps instances the retention sweep is about to delete."""

    async def archive(self, instances: Sequence[ArchivedInstance]) -> None:
        """Keep ``instances`` durably before returning; raise if they were not kept."""
        ...


class JsonlArchiver:
    """One ``.jsonl.gz`` file per sweep page in ``directory`` (created if missing).

    Each file is written under a temporary name, flushed to disk, then renamed: a file that
    exists under its final name is complete."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        #: The files this archiver has written, oldest first.
        self.written: list[Path] = []

    async def archive(self, instances: Sequence[ArchivedInstance]) -> None:
        if not instances:
            return
        path = await asyncio.to_thread(self._write, instances)
        self.written.append(path)

    def _write(self, instances: Sequence[ArchivedInstance]) -> Path:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            final = self.directory / f"flowx-archive-{stamp}-{uuid.uuid4().hex[:8]}.jsonl.gz"
            partial = final.with_suffix(".partial")
            with partial.open("wb") as raw:
                with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
                    for item in instances:
                        gz.write(json.dumps(_to_json(item), sort_keys=True).encode() + b"\n")
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(partial, final)
            folder = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError as exc:
            raise FlowXError(
                f"the archive could not be written to {self.directory} ({exc}); nothing of "
                "this page was deleted. Fix the directory (space, permissions) and sweep again",
                code="retention.archive_failed",
            ) from exc
        return final


def read_archive(path: str | Path) -> list[ArchivedInstance]:
    """The instances a ``JsonlArchiver`` file holds, as the records they were."""
    out: list[ArchivedInstance] = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            doc = json.loads(line)
            if doc.get("format") != ARCHIVE_FORMAT:
                raise FlowXError(
                    f"{path} is not a FlowX archive of format {ARCHIVE_FORMAT!r}",
                    code="retention.archive_unknown",
                )
            out.append(
                ArchivedInstance(
                    instance=_from_json(InstanceRecord, doc["instance"]),
                    steps=tuple(_from_json(StepRecord, s) for s in doc["steps"]),
                    signals=tuple(_from_json(SignalRecord, s) for s in doc["signals"]),
                    events=tuple(_from_json(EventRecord, e) for e in doc["events"]),
                )
            )
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    return value


def _record(record: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _to_json(item: ArchivedInstance) -> dict[str, Any]:
    return {
        "format": ARCHIVE_FORMAT,
        "instance": _record(item.instance),
        "steps": [_record(s) for s in item.steps],
        "signals": [_record(s) for s in item.signals],
        "events": [_record(e) for e in item.events],
    }


R = TypeVar("R")
_ENUMS: dict[str, type[Enum]] = {"state": InstanceState, "outcome": Outcome}


def _from_json(cls: type[R], data: dict[str, Any]) -> R:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        value = data[f.name]
        if value is not None and "datetime" in str(f.type):
            value = datetime.fromisoformat(value)
        elif value is not None and f.name in _ENUMS:
            value = _ENUMS[f.name](value)
        values[f.name] = value
    return cls(**values)
