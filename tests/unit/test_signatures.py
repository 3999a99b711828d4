"""No public function or method of labkit takes more than eight parameters: options travel as objects (a
JobSpec, a SweepPlan, Tasks, Pods, a Workload), so that a caller names what it changes and nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

import labkit

MOST = 8


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return count - bool(a.args and a.args[0].arg in ("self", "cls"))


def long_signatures(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_") \
                    and parameters(node) > MOST:
                out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({parameters(node)})")
    return out


def test_no_public_function_takes_more_than_eight_parameters() -> None:
    assert long_signatures(Path(labkit.__file__).parent) == []


def test_the_count_sees_a_long_signature(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("class C:\n    def run(self, a, b, c, d, e, f, g, h, *, i): ...\n"
                                           "def _private(a, b, c, d, e, f, g, h, i): ...\n"
                                           "def fine(self, a, b, c, d, e, f, g): ...\n")
    assert long_signatures(tmp_path / "pkg") == ["pkg/m.py:2 run (9)"]
