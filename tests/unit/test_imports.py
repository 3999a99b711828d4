"""Every ``from labkit.X import NAME`` in the package, the tests and the notebooks names something that exists.

Imports inside functions only fail when the function runs; this finds them all at once.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json

from helpers import paths

ROOT = paths.ROOT


def _sources() -> list[tuple[str, str]]:
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "labkit").rglob("*.py"))]
    out += [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "tests").rglob("*.py"))]
    for nb in sorted((ROOT / "labs").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out.append((nb.name, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))))
    return out


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for where, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "labkit":
                found += [(where, node.module, a.name) for a in node.names]
    return found


def _missing(uses: list[tuple[str, str, str]]) -> list[str]:
    missing = []
    for where, module, name in uses:
        mod = importlib.import_module(module)
        if hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")  # a submodule
        except ImportError:
            missing.append(f"{where}: {module}.{name}")
    return missing


def test_every_imported_name_exists() -> None:
    uses = _imports()
    assert len(uses) > 100  # the scan found the imports
    assert _missing(uses) == []


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _attributes() -> list[tuple[str, str, str]]:
    """``mod.attr`` uses where ``mod`` came from ``from labkit.PACKAGE import mod`` (or ``from labkit import``)."""
    found = set()
    for where, text in _sources():
        tree = ast.parse(text)
        bound = {(a.asname or a.name): f"{node.module}.{a.name}" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "labkit"
                 for a in node.names if _is_module(f"{node.module}.{a.name}")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                if isinstance(node.ctx, ast.Load):
                    found.add((where, bound[node.value.id], node.attr))
    return sorted(found)


def test_every_used_module_attribute_exists() -> None:
    uses = _attributes()
    assert len(uses) > 100
    assert _missing(uses) == []
