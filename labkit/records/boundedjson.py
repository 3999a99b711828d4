"""A JSON line a learner wrote, decoded without trusting it: bounded in size, depth and numbers, and shown in a
terminal without being obeyed; and a JSON file a process of the learner's may have written, read bounded in size.

:func:`decode_line` takes at most :data:`LINE_LIMIT` bytes of strict UTF-8; :func:`loads` refuses arrays and
objects nested deeper than :data:`MAX_DEPTH` (or more than :data:`MAX_CONTAINERS` of them) before decoding, and
decodes an integer longer than :data:`NUMBER_DIGITS` digits, NaN or Infinity to a :class:`Refused`, never a
number, so that every field check refuses it. :func:`for_terminal` escapes what a terminal would obey.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from pathlib import Path
from typing import Any

LINE_LIMIT = 8 * 1024  # bytes of one line read: twice the longest record labkit writes (600 escaped characters)
MAX_DEPTH = 16  # arrays and objects inside one another in one line (a record is one flat object)
MAX_CONTAINERS = 256  # arrays and objects in one line
NUMBER_DIGITS = 20  # digits of an integer read; a longer one is no step or time, and is never converted
FILE_LIMIT = 16 * 1024 * 1024  # bytes of one record file a rank writes (a probed rank's record: tens of KB)


class Refused:
    """What a JSON number no record holds decodes to (NaN, Infinity, an integer of too many digits): never a
    float or an int, so every field's check refuses it, and :meth:`Record.parse` names it in any other field."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what


def _int(text: str) -> int | Refused:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= NUMBER_DIGITS else Refused(f"a number of {digits} digits")


def _float(text: str) -> float | Refused:
    value = float(text)
    return value if math.isfinite(value) else Refused("a number beyond a float's range")


DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=lambda _: Refused("NaN or Infinity"))
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*\\?(?:"|\Z)', re.DOTALL)  # a JSON string, or one left open
_BRACKET = re.compile(r"[\[\]{}]")
_OPENS = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting(text: str) -> str | None:
    """What makes the JSON ``text`` too deep to decode, found without decoding it (brackets inside strings do not
    count): arrays and objects nested deeper than :data:`MAX_DEPTH`, or more than :data:`MAX_CONTAINERS` of them
    (a record is one object); None when it is neither."""
    bare = _STRING.sub("", text) if '"' in text else text
    opened = bare.count("[") + bare.count("{")
    if opened <= MAX_DEPTH:
        return None  # nested no deeper than there are arrays and objects
    if opened > MAX_CONTAINERS:
        return f"{opened} arrays or objects (more than {MAX_CONTAINERS})"
    if max(accumulate(map(_OPENS.__getitem__, _BRACKET.findall(bare)))) > MAX_DEPTH:  # the depth after each
        return f"arrays or objects nested deeper than {MAX_DEPTH}"
    return None


def loads(text: str) -> Any:
    """The JSON ``text``, bounded: ValueError when it is nested too deep (:func:`nesting`, checked before it is
    decoded) or is no JSON; an integer longer than :data:`NUMBER_DIGITS` digits, NaN or Infinity decodes to a
    :class:`Refused`, never a number."""
    deep = nesting(text)
    if deep is not None:
        raise ValueError(f"{deep}: nested too deep, not decoded")
    try:
        return DECODER.decode(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e})") from None
    except RecursionError:  # not reached past the check above; said, never raised
        raise ValueError("nested too deep, not decoded") from None


def decode_line(line: bytes) -> Any:
    """One line of a class file, bounded (:data:`LINE_LIMIT` bytes, strict UTF-8, then :func:`loads`)."""
    if len(line) > LINE_LIMIT:
        raise ValueError(f"longer than {LINE_LIMIT} bytes ({len(line)}), not decoded")
    try:
        text = line.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {e.start + 1})") from None
    return loads(text)


def read_file(path: str | Path, limit: int | None = None) -> Any:
    """The JSON file ``path``, which a process running the learner's script wrote (so the script may have written
    it too): at most ``limit`` bytes (default :data:`FILE_LIMIT`) are read. ``OSError`` when it cannot be read;
    ``ValueError`` when it is larger, is no JSON, or is nested too deep to decode (the readers then leave it out, as
    a file cut short)."""
    limit = FILE_LIMIT if limit is None else limit
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{Path(path).name} is larger than {limit} bytes: not read")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{Path(path).name} is nested too deep: not read") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{Path(path).name} is not UTF-8 text (byte {e.start + 1})") from None


def for_terminal(text: str) -> str:
    """``text`` as a terminal shows it and never obeys it: every character that is not printable (control
    characters and escape sequences, bidi overrides and other format characters, line and paragraph separators,
    lone surrogates) written as its Python escape, ``\\x1b``, ``\\u202e``. Printable text is returned as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
