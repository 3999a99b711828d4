"""The one observer of a rank (labkit.instrument.observer): it holds every hook's listeners, and nothing else in
labkit.instrument keeps state at module level."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

import labkit.instrument
from labkit.instrument import observer
from labkit.instrument.hooks import coordinator
from labkit.instrument.hooks.listeners import Listeners

PACKAGE = Path(labkit.instrument.__file__).parent
# Calls whose result cannot change: a module may keep those.
IMMUTABLE = {"Path", "frozenset", "tuple", "TypeVar", "compile", "Private", "Entry", "namedtuple"}


def _call_name(node: ast.expr) -> str:
    func = node.func if isinstance(node, ast.Call) else node
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run at import: the module's own, and those inside its ``if``, ``try`` and ``with`` blocks (not
    the ``if __name__ == "__main__":`` of a script)."""
    out = []
    for node in body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        out.append(node)
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                out += _module_level(getattr(node, block, []))
        for handler in getattr(node, "handlers", []):
            out += _module_level(handler.body)
    return out


def module_state(source: str) -> list[str]:
    """The module-level names ``source`` binds to something that can change (an empty container, an object made
    by a call), its memoised functions, the statements it runs at module level, and its ``global`` statements."""
    found = []
    for node in _module_level(ast.parse(source).body):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = ", ".join(ast.unparse(t) for t in targets)
            value = node.value
            empty = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
                getattr(value, "keys", None) or getattr(value, "elts", None))
            made = isinstance(value, ast.Call) and _call_name(value) not in IMMUTABLE
            if empty or made:
                found.append(f"{names} = {ast.unparse(value)}")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if any(_call_name(d) in ("lru_cache", "cache", "cached") for d in node.decorator_list):
                found.append(f"memo {node.name}")
        elif isinstance(node, (ast.AugAssign, ast.Expr)) and not (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # a docstring is fine
            found.append(ast.unparse(node))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Global):
            found.append(f"global {', '.join(node.names)}")
    return found


def test_the_observer_is_the_only_module_level_state_of_a_rank() -> None:
    found = {str(path.relative_to(PACKAGE)): module_state(path.read_text())
             for path in sorted(PACKAGE.rglob("*.py"))}
    found = {name: state for name, state in found.items() if state}
    # The observer, and a bounded memo of the data set's files (the same bytes for every run of a process).
    assert found == {"observer.py": ["OBSERVER = Observer()"], "data.py": ["memo _splits"]}


@pytest.mark.parametrize("source", [
    "_CACHE: dict[str, int] = {}",
    "_HOOK = new_hook()",
    "HOOKS = []",
    "def f():\n    global X\n    X = 1",
    "import sys\nsys.meta_path.insert(0, finder)",
    "@functools.lru_cache(maxsize=None)\ndef load():\n    pass",
    "@cache\ndef load():\n    pass",
    "try:\n    import x\nexcept ImportError:\n    CACHE = {}",
    "if True:\n    HOOK = make()",
    "if __name__ == '__main__':\n    main()\nHOOK = make()",
])
def test_the_module_state_test_finds_each_kind(source: str) -> None:
    assert module_state(source)


def test_constants_are_not_module_state() -> None:
    assert module_state('"""doc"""\nNAMES = ("a", "b")\nFILES = {"x": 1}\nROOT = Path("/x")\nT = TypeVar("T")') == []


def test_the_coordinators_listeners_hear_each_worker_that_finished_a_step_even_a_failed_one() -> None:
    class Worker:
        def __init__(self, index: int) -> None:
            self.worker_index = index

        def _process_closure(self, closure: object) -> object:
            if closure == "fails":
                raise RuntimeError("step failed")
            return closure

    module = types.SimpleNamespace(Worker=Worker)
    heard: list[int] = []
    listeners: Listeners[coordinator.Listener] = Listeners(lambda: coordinator.wrap(module, listeners))
    assert Worker(0)._process_closure("before") == "before" and heard == []  # not wrapped before a listener
    listeners.add(heard.append)
    assert Worker(1)._process_closure("step") == "step"
    with pytest.raises(RuntimeError):
        Worker(0)._process_closure("fails")
    assert heard == [1, 0]


def test_a_hook_the_run_probe_needs_that_fails_is_noted_never_raised_into_the_script() -> None:
    own = observer.Observer()
    module = types.SimpleNamespace()  # no Worker: as if TensorFlow had moved it
    own.when_imported("types", lambda _m: coordinator.wrap(module, own.closures), noted=True)
    assert own.run.record.observer_errors == ["types: AttributeError: 'types.SimpleNamespace' object has no "
                                              "attribute 'Worker'"]
