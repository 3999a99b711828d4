"""Typed records read from JSON: a dataclass built from a decoded object, every field checked against its annotation.

:func:`parse` is the one place a record written by another process (a probed rank, an earlier check) becomes an
object: a field of the wrong type, or a required one missing, raises :class:`RecordError` naming the file and the
field's path (``probe.1.json: epochs[0].train_batches: expected int, got 'x'``), never a ``KeyError`` far from the
file. :func:`dump` is its inverse, for the writer. Keys the dataclass does not declare are ignored (a newer writer
may add some); missing fields take their defaults. Supported annotations: dataclasses, ``int``, ``float`` (an int is
accepted), ``str``, ``bool``, ``Any``, ``X | None``, ``list[X]``, ``tuple[X, ...]`` and ``dict[str | int, X]`` (JSON
object keys are strings: an ``int`` key is converted). A field whose JSON name is a Python keyword says it in its
metadata: ``cls: str = field(default="", metadata={typed.JSON_KEY: "class"})``. A field a writer leaves out of the
JSON in some records says when in its metadata (:data:`OMIT_NONE`, :data:`OMIT_DEFAULT`, :func:`omit_unless`), so
that :func:`dump` writes the record as its writer always has.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, TypeVar, Union

T = TypeVar("T")
JSON_KEY = "json"  # a field's metadata key for a JSON name Python cannot spell (``class``)
OMIT_NONE = {"omit_none": True}  # a field's metadata: :func:`dump` leaves it out while it is None
OMIT_DEFAULT = {"omit_default": True}  # a field's metadata: :func:`dump` leaves it out while it equals its default
REST = {"rest": True}  # a ``dict`` field's metadata: it holds the object's other keys, side by side in the JSON
MAX_ITEMS = 100_000  # entries of one list or object: more is no record a probe writes


class RecordError(ValueError):
    """A record that does not have the shape its reader declares."""


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def parse(cls: type[T], data: Any, where: str = "record") -> T:
    """``data`` (decoded JSON) as a ``cls``; :class:`RecordError` names ``where`` and the field that is wrong."""
    return _value(cls, data, where)


def omit_unless(other: str) -> dict[str, str]:
    """A field's metadata: :func:`dump` leaves it out while the field ``other`` is None (a value that comes with
    another one, and is written with it even when it is None)."""
    return {"omit_unless": other}


def _omitted(record: Any, f: dataclasses.Field) -> bool:
    """Whether :func:`dump` leaves the field ``f`` of ``record`` out, as its metadata says."""
    value = getattr(record, f.name)
    if f.metadata.get("omit_none") and value is None:
        return True
    if f.metadata.get("omit_unless") and getattr(record, f.metadata["omit_unless"]) is None:
        return True
    if f.metadata.get("omit_default"):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        return bool(value == default)
    return False


def dump(record: Any) -> Any:
    """``record`` as JSON-able values: dataclasses as objects (under their JSON names, a field whose metadata says so
    left out: :data:`OMIT_NONE`, :data:`OMIT_DEFAULT`, :func:`omit_unless`), tuples as lists. Other values are left
    for the JSON encoder."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out = {f.metadata.get(JSON_KEY, f.name): dump(getattr(record, f.name)) for f in dataclasses.fields(record)
               if not f.metadata.get("rest") and not _omitted(record, f)}
        for f in dataclasses.fields(record):
            if f.metadata.get("rest"):
                out.update({k: dump(v) for k, v in getattr(record, f.name).items() if k not in out})
        return out
    if isinstance(record, list | tuple):
        return [dump(v) for v in record]
    if isinstance(record, dict):
        return {k: dump(v) for k, v in record.items()}
    return record


def _fail(where: str, want: str, got: Any) -> RecordError:
    shown = repr(got)
    return RecordError(f"{where}: expected {want}, got {shown[:80]}{'...' if len(shown) > 80 else ''}")


def _value(tp: Any, data: Any, where: str) -> Any:
    if tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _value(option, data, where)
            except RecordError as e:
                errors.append(str(e))
        raise RecordError(errors[0] if len(errors) == 1 else f"{where}: none of {tp} fits {repr(data)[:80]}")
    if dataclasses.is_dataclass(tp):
        return _record(tp, data, where)
    if origin is list or origin is tuple:
        if not isinstance(data, list | tuple) or len(data) > MAX_ITEMS:  # a tuple: asdict of a record
            raise _fail(where, "a list", data)
        item = typing.get_args(tp)[0]
        items = [_value(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return items if origin is list else tuple(items)
    if origin is dict:
        key_tp, item = typing.get_args(tp)
        if not isinstance(data, dict) or len(data) > MAX_ITEMS:
            raise _fail(where, "an object", data)
        return {_key(key_tp, k, where): _value(item, v, f"{where}.{k}") for k, v in data.items()}
    return _scalar(tp, data, where)


def _key(tp: Any, key: str, where: str) -> Any:
    if tp is int:
        try:
            return int(key)
        except ValueError:
            raise _fail(f"{where} key", "an integer", key) from None
    return key


def _scalar(tp: Any, data: Any, where: str) -> Any:
    if tp is bool:
        ok = isinstance(data, bool)
    elif tp is int:
        ok = isinstance(data, int) and not isinstance(data, bool)
    elif tp is float:
        ok = isinstance(data, (int, float)) and not isinstance(data, bool)
        data = float(data) if ok else data
    elif tp is str:
        ok = isinstance(data, str)
    else:
        raise TypeError(f"typed records cannot read {tp!r}")  # a reader's mistake, not the file's
    if not ok:
        raise _fail(where, tp.__name__, data)
    return data


def _record(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise _fail(where, f"an object ({cls.__name__})", data)
    hints = _hints(cls)
    values = {}
    declared = {f.metadata.get(JSON_KEY, f.name) for f in dataclasses.fields(cls) if not f.metadata.get("rest")}
    for f in dataclasses.fields(cls):
        if f.metadata.get("rest"):
            values[f.name] = _value(hints[f.name], {k: v for k, v in data.items() if k not in declared}, where)
            continue
        key = f.metadata.get(JSON_KEY, f.name)
        if key in data:
            values[f.name] = _value(hints[f.name], data[key], f"{where}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"{where}: the field {key!r} is missing")
    return cls(**values)
