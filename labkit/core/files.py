"""The one atomic writer: files that readers see whole, old or new, never half written."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and infinities as null, numpy scalars as numbers, anything else as text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    try:  # numpy scalars
        return json_safe(value.item())
    except (AttributeError, ValueError):
        return str(value)


def write_json_atomic(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(json_safe(data)))
    os.replace(tmp, path)
