"""labkit.instrument.probe_allreduce: what a probed rank hands Horovod's all-reduce, by dtype, and the private
Horovod names it patches (this file fails when they move)."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from labkit.instrument import probe_allreduce
from labkit.instrument.probe_record import Rank


def _horovod_tensorflow() -> Path:
    """horovod/tensorflow/ of the installed Horovod, found without importing it (nor TensorFlow)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("Horovod is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "tensorflow"


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {node.func.id for node in ast.walk(fn) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def test_horovod_all_reduces_through_the_names_the_probe_patches() -> None:
    """``allreduce()`` and ``grouped_allreduce()`` of horovod.tensorflow call ``_allreduce`` and
    ``_grouped_allreduce``, module globals imported from mpi_ops, on what the compression gave them. If Horovod
    renames or moves them, the probe would see nothing: this test says so first."""
    folder = _horovod_tensorflow()
    init = folder / "__init__.py"
    tree = ast.parse(init.read_text())
    imported = {alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and node.module == "horovod.tensorflow.mpi_ops" for alias in node.names}
    assert set(probe_allreduce.NAMES) <= imported, f"{init} no longer imports {probe_allreduce.NAMES} from mpi_ops"
    public = _functions(init)
    assert "_allreduce" in _calls(public["allreduce"])
    assert "_grouped_allreduce" in _calls(public["grouped_allreduce"])
    for name in ("allreduce", "grouped_allreduce"):  # the op gets the compressed tensors
        assert "compression.compress" in ast.unparse(public[name]), name
    ops = _functions(folder / "mpi_ops.py")
    assert [a.arg for a in ops["_allreduce"].args.args[:1]] == ["tensor"]
    assert [a.arg for a in ops["_grouped_allreduce"].args.args[:1]] == ["tensors"]
    grads = _functions(init)["_make_allreduce_grads_fn"]  # the optimizer's gradients go through allreduce()
    assert "_make_cached_allreduce_grads_fn" in _calls(grads)


def test_the_condition_horovod_puts_around_each_gradient_is_the_constant_the_probe_decides() -> None:
    """Outside elastic mode ``_allreduce_cond`` and ``_grouped_allreduce_cond`` run ``tf.cond`` on
    ``process_set.included() and process_set.size() > 1`` and all-reduce in the true branch, and the gradients go
    through them: the probe decides that constant in Python instead. If Horovod changes either, this fails."""
    init = _horovod_tensorflow() / "__init__.py"
    fns = _functions(init)
    for name, op in zip(probe_allreduce.CONDS, ("allreduce", "grouped_allreduce"), strict=True):
        text = ast.unparse(fns[name])
        assert "process_set.included() and process_set.size() > 1" in text, (name, text)
        assert "tf.cond(cond, allreduce_fn, id_fn)" in text and "HOROVOD_ELASTIC" in text, (name, text)
        inner = {f.name: f for f in ast.walk(fns[name]) if isinstance(f, ast.FunctionDef)}
        assert op in _calls(inner["allreduce_fn"]), (name, op)
        assert [a.arg for a in fns[name].args.args[:1]] == ["tensor" if op == "allreduce" else "tensors"]
    grads = ast.unparse(fns["_make_allreduce_grads_fn"]) + "".join(ast.unparse(f) for f in fns.values()
                                                                     if "def allreduce_grads" in ast.unparse(f))
    assert all(name in grads for name in probe_allreduce.CONDS), "the gradients no longer go through the conditions"


def test_the_conditions_are_decided_as_horovod_decides_and_left_alone_in_elastic_mode(monkeypatch) -> None:
    calls: list[tuple[str, Any]] = []

    class _Set:
        def __init__(self, included: bool, size: int) -> None:
            self._included, self._size = included, size

        def included(self) -> bool:
            return self._included

        def size(self) -> int:
            return self._size

    hvd = SimpleNamespace(global_process_set=_Set(True, 2), _allreduce_cond="real", _grouped_allreduce_cond="real",
                          allreduce=lambda t, **kw: calls.append(("one", t)) or "reduced",
                          grouped_allreduce=lambda ts, **kw: calls.append(("group", ts)) or ["reduced"])
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    probe_allreduce._decide_in_python(hvd, lambda f: f)
    assert hvd._allreduce_cond == "real"
    monkeypatch.delenv("HOROVOD_ELASTIC")
    hvd._allreduce_cond = hvd._grouped_allreduce_cond = lambda *a, **k: None  # callable, as Horovod's are
    probe_allreduce._decide_in_python(hvd, lambda f: f)
    assert hvd._allreduce_cond("g") == "reduced" and hvd._grouped_allreduce_cond(["g"]) == ["reduced"]
    assert hvd._allreduce_cond("g", process_set=_Set(True, 1)) == "g"  # one rank: nothing to all-reduce
    assert hvd._allreduce_cond("g", process_set=_Set(False, 4)) == "g"  # not in the set
    assert calls == [("one", "g"), ("group", ["g"])]


class _Tensor:
    def __init__(self, dtype: str) -> None:
        self.dtype = SimpleNamespace(name=dtype)


@pytest.fixture
def rank(tmp_path: Path) -> Rank:
    rank = Rank(str(tmp_path))
    rank.state.rank_env = 1
    return rank


@pytest.fixture
def probed(tmp_path: Path, rank: Rank) -> Path:
    return tmp_path / probe_allreduce.file_name(1)


def test_tensors_built_into_the_training_step_are_gradients_the_rest_other(probed: Path, rank: Rank) -> None:
    calls: list[Any] = []
    graph = {"now": False}
    fake = SimpleNamespace(_allreduce=lambda t, **k: calls.append(("one", t, k)) or "one",
                           _grouped_allreduce=lambda ts, **k: calls.append(("group", ts, k)) or "group")
    probe_allreduce.patch(fake, rank, eager=lambda: not graph["now"])
    assert fake._allreduce(_Tensor("float32"), name="m") == "one"  # eager, outside fit
    assert calls[-1][2] == {"name": "m"}  # the arguments passed on
    rank.state.in_fit = True
    fake._allreduce(_Tensor("float32"))  # eager in fit: a metric averaged by a callback
    graph["now"] = True
    group = (_Tensor("float16"), _Tensor("float16"))
    assert fake._grouped_allreduce(group) == "group" and calls[-1][1] is group  # passed on untouched
    fake._allreduce(_Tensor("float16"))
    assert json.loads(probed.read_text()) == {"gradients": {"float16": 3}, "other": {"float32": 2}}


def test_a_horovod_without_the_names_is_said_not_patched_in_silence(probed: Path, rank: Rank) -> None:
    fake = SimpleNamespace(_allreduce=lambda t: t)
    probe_allreduce.patch(fake, rank, eager=lambda: True)
    assert "no _grouped_allreduce" in json.loads(probed.read_text())["error"]


def test_a_failing_observation_never_breaks_the_script(probed: Path, rank: Rank) -> None:
    fake = SimpleNamespace(_allreduce=lambda t: "reduced", _grouped_allreduce=lambda ts: ts)

    def broken() -> bool:
        raise RuntimeError("no graph here")

    probe_allreduce.patch(fake, rank, eager=broken)
    assert fake._allreduce(_Tensor("float32")) == "reduced" and not probed.exists()


def test_horovods_sync_batch_norm_all_reduces_past_the_names_the_tally_counts() -> None:
    """Lab 9's step 1 counts the gradient all-reduces of each batch; Horovod's SyncBatchNormalization all-reduces
    its statistics every batch through ``mpi_ops._allreduce`` imported into its own module, which the probe does not
    patch. If Horovod moves it onto ``horovod.tensorflow._allreduce``, a script with --sync-bn would seem to
    all-reduce at every batch: this fails first."""
    source = (_horovod_tensorflow() / "sync_batch_norm.py").read_text()
    tree = ast.parse(source)
    imported = {(node.module, alias.name) for node in tree.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert ("horovod.tensorflow.mpi_ops", "_allreduce") in imported
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "_allreduce" in calls and "allreduce" not in calls


def test_the_tally_counts_only_the_all_reduces_that_ran() -> None:
    """An all-reduce in a branch the step does not take (Horovod's accumulation between updates) adds nothing."""
    tf = pytest.importorskip("tensorflow")
    tally = probe_allreduce.Tally(tf)

    @tf.function
    def step(reduce_now: Any) -> Any:
        def reduced() -> Any:
            out = tf.constant([3.0, 4.0]) * 1.0
            tally.add([out])
            return out

        return tf.cond(reduce_now, reduced, lambda: tf.zeros(2))

    step(tf.constant(False))
    assert tally.take() == (0, 0.0)
    step(tf.constant(True))
    assert tally.take() == (1, 5.0)
    assert tally.take() == (0, 0.0)  # taken: the tally starts again
