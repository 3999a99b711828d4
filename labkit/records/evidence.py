"""A check's evidence, typed, and the one place it crosses a file: what every lab's evidence has, its writer and
its reader.

Each lab's check (:mod:`labkit.check.judging`) runs the learner's script under a probe and keeps what the processes
did as one record, a subclass of :class:`Evidence` its judge module names (``EVIDENCE``): its ``collect`` returns
it, its judges read it, the check caches it. :func:`record` reads each file a process of the learner's wrote into it
(a rank's ``probe.N.json``, a task's record) once, every field checked (:mod:`labkit.records.typed`): a file of the
wrong shape is left out and named, and the check fails step 1 saying which (:meth:`Evidence.record_error`).

Saved as JSON (``evidence_out=``, the tests' recorded runs: :func:`write`), the evidence is read back once
(:func:`read_json`, then :func:`parse` as the class of the lab the file names: :func:`labkit.check.judging.load`): its
schema version first (``format`` in the JSON, :data:`SCHEMA`), then every field. A file that cannot be read, is no
evidence, is of another version or holds a field of the wrong type raises :class:`EvidenceError` naming the file
(and the field), never a ``KeyError`` or ``TypeError`` in a judge.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from labkit.records import boundedjson, typed

# Bumped whenever the evidence a probe run produces changes shape; saved evidence carries it ("format"), and a file
# of another version is refused (the tests' recorded runs are then recorded again: make probe-fixtures).
SCHEMA = 2
FILE_LIMIT = 64 * 1024 * 1024  # bytes of a saved evidence file (a Horovod check's three runs: about 350 KB)

T = TypeVar("T")


class EvidenceError(ValueError):
    """A saved evidence file that cannot be read as a check's evidence; the message names the file."""


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What every check's evidence has: its schema version (``format`` in the JSON), the steps its run lets the
    judges decide (``covers``, set by the check), and whether the run was cut short on purpose (``partial``: what a
    wider run shows is not in it, so a wider check runs again even when this one failed).

    A lab's evidence adds its own fields, and says what the check needs of them through the methods below."""

    schema: int = field(default=SCHEMA, metadata={typed.JSON_KEY: "format"})
    covers: int = 0
    partial: bool = field(default=False, metadata=typed.OMIT_DEFAULT)

    def cut_short(self) -> bool:
        """Whether the run was interrupted or ran out of time: a busy machine may pass later, so it is not kept."""
        return False

    def run_failure(self) -> str | None:
        """How the run as a whole failed, told after a failed step's message (None: it did not, or the lab's
        judges tell it themselves)."""
        return None

    def record_error(self) -> str | None:
        """A record a process of the learner's wrote that could not be read, named with the field that is wrong
        (None: every record read)."""
        return None

    def processes_left(self) -> list[tuple[str, list[str]]]:
        """The command lines each rank (or task) left running when it ended, by rank, in the order of the runs."""
        return []


E = TypeVar("E", bound=Evidence)


def record(cls: type[T], path: Path, unreadable: list[str] | None = None) -> T | None:
    """The record ``path`` that a process running the learner's script wrote (so the script may have written it
    too), read bounded and typed once: None for one that is missing, cut short or no JSON (left out, as a process
    killed mid-write leaves it); one of the wrong shape is left out too, and what is wrong with it (the file and the
    field) is appended to ``unreadable``."""
    try:
        data = boundedjson.read_file(path)
    except (OSError, ValueError):
        return None
    try:
        return typed.parse(cls, data, path.name)
    except typed.RecordError as e:
        if unreadable is not None:
            unreadable.append(str(e))
        return None


def from_json(cls: type[E]) -> Callable[[Any], E]:
    """The parser of ``cls`` from its decoded JSON, every field checked (:class:`typed.RecordError` names what is
    wrong): how a test builds a lab's evidence. Saved evidence is read by :func:`labkit.check.judging.load`."""

    def parse_evidence(data: Any) -> E:
        return typed.parse(cls, data, "evidence")

    return parse_evidence


def write(evidence: Evidence, path: Path) -> None:
    """Save ``evidence`` as JSON (its fields under their JSON names, keys sorted), for :func:`read`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(typed.dump(evidence), indent=1, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    """The saved evidence ``path`` decoded, not yet typed (bounded: :data:`FILE_LIMIT`); :class:`EvidenceError`
    naming the file when it cannot be read or is no JSON object."""
    try:
        data = boundedjson.read_file(path, FILE_LIMIT)
    except OSError as e:
        raise EvidenceError(f"{path}: the evidence file cannot be read ({e.strerror or e})") from None
    except ValueError as e:
        raise EvidenceError(f"{path}: not an evidence file ({e})") from None
    if not isinstance(data, dict):
        raise EvidenceError(f"{path}: not an evidence file (a JSON object was expected, it holds "
                            f"{type(data).__name__ if data is not None else 'null'})")
    return data


def parse(cls: type[E], data: dict[str, Any], path: Path) -> E:
    """``data``, decoded from the saved evidence ``path``, as a ``cls``: its schema version, then every field
    checked; :class:`EvidenceError` naming the file (and the field) when it is not one."""
    version = data.get("format", SCHEMA)
    if type(version) is not int or version != SCHEMA:
        raise EvidenceError(f"{path}: evidence format {version!r}, and this labkit reads format {SCHEMA}: record it "
                            "again")
    try:
        return typed.parse(cls, data, "evidence")
    except typed.RecordError as e:
        raise EvidenceError(f"{path}: not the evidence of a check ({e})") from None
