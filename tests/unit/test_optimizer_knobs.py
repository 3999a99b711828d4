"""Horovod's optimizer knobs from outside (``labkit bench --optimizer``): parsed, applied unless the script gives
them, left out where an optimizer does not take them, recorded; and in a real observed process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from labkit.cli import main as cli
from labkit.core import contract
from labkit.instrument import observe, observer, optimizer_knobs, shrink
from labkit.instrument.start import command as probe_command
from labkit.records import jobrecord, observation


def test_knobs_are_parsed_or_refused_with_the_forms() -> None:
    assert optimizer_knobs.parse("compression=fp16, backward_passes_per_step=2") == {
        "compression": "fp16", "backward_passes_per_step": 2}
    for bad in ("", "compression=fp8", "backward_passes_per_step=0", "fusion=1", "compression"):
        with pytest.raises(ValueError, match="compression=none|fp16"):
            optimizer_knobs.parse(bad)


def _module(with_passes: bool = True) -> SimpleNamespace:
    calls: list[dict] = []
    if with_passes:
        def real(optimizer: Any, name: Any = None, compression: Any = "NONE", backward_passes_per_step: int = 1):
            calls.append({"compression": compression, "backward_passes_per_step": backward_passes_per_step})
            return optimizer
    else:
        def real(optimizer: Any, name: Any = None, compression: Any = "NONE"):  # like horovod.keras
            calls.append({"compression": compression})
            return optimizer
    return SimpleNamespace(DistributedOptimizer=real, Compression=SimpleNamespace(fp16="FP16", none="NONE"),
                           calls=calls)


def test_the_optimizer_takes_the_knobs_unless_the_script_gives_them() -> None:
    applied: dict[str, Any] = {}
    module = _module()
    optimizer_knobs.hooks({"compression": "fp16", "backward_passes_per_step": 2}, applied.update)[
        "horovod.tensorflow.keras"](module)
    assert module.DistributedOptimizer("sgd") == "sgd"
    assert module.calls[-1] == {"compression": "FP16", "backward_passes_per_step": 2}
    assert applied == {"compression": "fp16", "backward_passes_per_step": 2}
    applied.clear()
    module.DistributedOptimizer("sgd", backward_passes_per_step=4)  # the script's own value wins
    assert module.calls[-1] == {"compression": "FP16", "backward_passes_per_step": 4}
    assert applied == {"compression": "fp16"}
    with pytest.raises(TypeError):
        module.DistributedOptimizer()  # Horovod's own error, untouched
    old = _module(with_passes=False)
    optimizer_knobs.hooks({"backward_passes_per_step": 2, "compression": "fp16"}, applied.update)[
        "horovod.keras"](old)
    old.DistributedOptimizer("sgd")
    assert old.calls[-1] == {"compression": "FP16"}


SCRIPT = textwrap.dedent('''
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    print("passes", opt._agg_helper.backward_passes_per_step, flush=True)
    model.compile(opt, "mse")
    model.fit(tf.zeros((8, 4)), tf.zeros((8, 2)), batch_size=4, epochs=1, verbose=0)
''')


@pytest.mark.slow  # several seconds: out of make test-fast
def test_an_observed_horovod_script_gets_them_and_its_record_says_so(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    env = {**clean, contract.OPTIMIZER: "backward_passes_per_step=2,compression=fp16"}
    argv = probe_command("run", str(tmp_path / "obs"), [sys.executable, "train.py"])  # as a launcher starts it
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "passes 2" in out.stdout
    rec = jobrecord.measured(observation.read(tmp_path / "obs"))
    assert rec.optimizer_knobs == {"backward_passes_per_step": 2, "compression": "fp16"}
    assert rec.gradient_bytes == 4 * (4 * 2 + 2)


def test_bench_checks_the_knobs_before_it_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", str(tmp_path / "train.py"), "--optimizer", "compression=fp8"])
    assert stop.value.code == 2 and "compression=none|fp16" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [tmp_path / "train.py"]


def test_a_bad_setting_from_outside_is_the_observers_error_never_the_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observe, "OBSERVER", observer.Observer())
    observe._from_outside("optimizer_knobs", "compression=fp8", optimizer_knobs.from_spec)
    observe._from_outside("shrink", "6000,1000", shrink.from_spec)
    assert observe.OBSERVER.run.record.optimizer_knobs is None and observe.OBSERVER.run.record.shrink is None
    errors = observe.OBSERVER.run.record.observer_errors
    assert "compression=none|fp16" in errors[0] and "want TRAIN,TEST,DIVISOR" in errors[1]
    note, hooks = optimizer_knobs.from_spec("compression=fp16")
    assert note == {} and set(hooks) == set(optimizer_knobs.MODULES)  # filled as the script builds optimizers
    assert shrink.from_spec("6000,1000,10")[0] == {"train": 6000, "test": 1000, "width_divisor": 10}
