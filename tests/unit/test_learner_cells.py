"""Learner cells hold what the learner reads and changes: no test plumbing, no solutions.

Every code cell of every notebook is scanned for what belongs in labkit or in the tests: environment
overrides, run records picked by internal ids, asserts, long helper functions, quick mode, solutions,
impossible arguments that only keep a test's run going; and no cell ends by showing a helper's internal
result object (``KnobResult(knob=..., ...)``) under its output.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
import typing
from pathlib import Path

import pytest
from helpers import paths

LABS = paths.LABS
NOTEBOOKS = sorted(LABS.glob("*.ipynb"))
HELPER_LINES = 8  # code lines a function defined in a cell may have (docstring and comments aside)

PATTERNS = {
    "an environment override": re.compile(r"\benv\s*=\s*(\{|dict\()|os\.environ|putenv"),
    "records picked by internal ids": re.compile(r"sweep_id|run_id|\.get\(\s*[\"'](bench|run_id)[\"']\s*\)"),
    "quick mode": re.compile(r"LABKIT_NB_QUICK|\b[Qq]uick\b|\bFAST\b|NB_QUICK"),
    "solutions": re.compile(r"solutions/|\.\./solutions|_solution\.py\b(?!\")"),
    "an accuracy no run can reach": re.compile(r"[\"']--target-accuracy[\"']\s*,\s*[\"']([2-9]|1\.\d*[1-9])"),
}


def _code_lines(node: ast.AST, source: str) -> int:
    """Lines of code in a function, its docstring, blank lines and comments left out."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    if not body:
        return 0
    lines = source.splitlines()[body[0].lineno - 1:body[-1].end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def plumbing(source: str) -> list[str]:
    """What in one cell's source is plumbing rather than the lab."""
    found = [f"{what}: {m.group(0)!r}" for what, rx in PATTERNS.items() for m in [rx.search(source)] if m]
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [*found, "a cell that does not parse"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found.append(f"an assert on line {node.lineno}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node, code) > HELPER_LINES:
            found.append(f"a helper function {node.name}() of {_code_lines(node, code)} lines: it belongs in labkit")
    return found


def learner_cells(path: Path) -> list[tuple[str, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(c.get("id", "?"), "".join(c["source"])) for c in cells if c["cell_type"] == "code"]


def test_the_scan_finds_plumbing() -> None:
    long_helper = "def lab_lr(epoch, workers):\n" + "".join(f"    x{i} = {i}\n" for i in range(HELPER_LINES)) + \
        "    return x0\n"
    bad = {
        'job = run(cmd, env={runs.FILE_VAR: "x"})': "environment override",
        'os.environ["A"] = "1"': "environment override",
        'records = [r for r in rs if r.get("bench") in ids]': "internal ids",
        'ids = {sweep.conditions["sweep_id"]}': "internal ids",
        'assert report.ok, "did not resume"': "an assert",
        long_helper: "helper function lab_lr",
        'SCRIPT = "../solutions/fashion_mnist_after_step_04.py"': "solutions",
        'if notebook.quick():\n    pass': "quick mode",
        'args = ["--epochs", "3", "--target-accuracy", "2"]': "accuracy no run can reach",
    }
    for source, expected in bad.items():
        found = "\n".join(plumbing(source))
        assert expected in found, (source, found)
    fine = ('def train(np=2):\n    """Launch."""\n    return notebook.run(["python", SCRIPT], np=np)\n'
            'report = check.horovod(3, script=SCRIPT)\nargs = ["--target-accuracy", "0.82"]\n%matplotlib inline\n'
            'job = dashboard.watch(["python", SCRIPT], np=2, records=RECORDS)\n')
    assert plumbing(fine) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_learner_cells_carry_no_plumbing(path: Path) -> None:
    found = [f"{path.name} cell {cell_id}: {what}" for cell_id, source in learner_cells(path)
             for what in plumbing(source)]
    assert found == [], "\n".join(found)


def _labkit_names(cells: list[str]) -> dict[str, str]:
    """The names a notebook imports from labkit (``from labkit.ui import comm_lab`` -> comm_lab: labkit.ui.comm_lab)."""
    names: dict[str, str] = {}
    for source in cells:
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _shown_as_repr(cls: object) -> bool:
    """True for a dataclass that Jupyter would show by the repr dataclasses generate (``Name(field=...)``)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return False
    if any(hasattr(cls, m) for m in ("_repr_html_", "_repr_markdown_", "_repr_png_", "_repr_svg_")):
        return False
    return cls.__repr__.__code__.co_filename != inspect.getsourcefile(cls)


def dumped_reprs(path: Path) -> list[str]:
    """Cells that end with a bare call to a labkit helper whose result Jupyter would show as its dataclass repr."""
    sources = [source for _, source in learner_cells(path)]
    names, found = _labkit_names(sources), []
    for cell_id, source in learner_cells(path):
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            last = ast.parse(code).body[-1:]
        except SyntaxError:
            continue
        if not (last and isinstance(last[0], ast.Expr) and isinstance(last[0].value, ast.Call)):
            continue
        func = last[0].value.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in names):
            continue
        module = importlib.import_module(names[func.value.id])
        returns = typing.get_type_hints(getattr(module, func.attr)).get("return")
        if any(_shown_as_repr(t) for t in (typing.get_args(returns) or (returns,))):
            found.append(f"{path.name} cell {cell_id}: {ast.unparse(last[0])[:60]} ends the cell; assign its result")
    return found


def test_the_repr_scan_finds_a_bare_helper_call(tmp_path: Path) -> None:
    cell = {"cell_type": "code", "id": "k", "metadata": {}, "outputs": [], "execution_count": None}
    nb = {"cells": [{**cell, "source": ['from labkit.ui import comm_lab\n', 'comm_lab.knob("fusion")']}]}
    (tmp_path / "bare.ipynb").write_text(json.dumps(nb))
    assert "cell k: comm_lab.knob('fusion') ends the cell" in "\n".join(dumped_reprs(tmp_path / "bare.ipynb"))
    nb["cells"][0]["source"][1] = 'fusion = comm_lab.knob("fusion")'
    (tmp_path / "kept.ipynb").write_text(json.dumps(nb))
    assert dumped_reprs(tmp_path / "kept.ipynb") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_ends_by_dumping_an_internal_repr(path: Path) -> None:
    """A helper's result object belongs in a variable: shown bare, Jupyter prints ``KnobResult(knob=..., ...)``."""
    assert dumped_reprs(path) == []
