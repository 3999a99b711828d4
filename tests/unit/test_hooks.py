"""The one hook per library entry point that every observer of a process shares (labkit.instrument.hooks): fit,
the command line, the data set and the convolutions, each tested on classes and modules of its own; the real
tf-keras ones in a process of their own."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import types

import pytest

from labkit.instrument.hooks import arguments, conv, dataset
from labkit.instrument.hooks import fit as fit_hook
from labkit.instrument.hooks.listeners import Listeners


class Model:
    def fit(self, x=None, y=None, epochs=1, callbacks=None, verbose="auto"):  # noqa: ANN001, ANN201
        if x == "boom":
            raise RuntimeError("fit failed")
        return {"x": x, "epochs": epochs, "callbacks": list(callbacks or []), "verbose": verbose}


class Listener:
    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    def before(self, call: fit_hook.FitCall) -> None:
        self.seen.append(f"before {self.name}")
        call.callbacks.append(self.name)

    def after(self, call: fit_hook.FitCall) -> None:
        self.seen.append(f"after {self.name} {type(call.error).__name__ if call.error else 'ok'}")


@pytest.fixture()
def listeners() -> Listeners[fit_hook.Listener]:
    return Listeners(lambda: None)  # this test's own table, the class wrapped by hand below (never tf-keras's)


@pytest.fixture()
def hook(listeners: Listeners[fit_hook.Listener]) -> type:
    cls = type("Model", (Model,), {})
    fit_hook.wrap(cls, listeners)
    return cls


def test_every_listener_runs_around_one_fit_in_order_and_sees_it_end(hook: type, listeners: Listeners) -> None:
    seen: list[str] = []
    assert hook().fit("data", epochs=3) == {"x": "data", "epochs": 3, "callbacks": [], "verbose": "auto"}  # none yet
    first = Listener("a", seen)
    listeners.add(first)
    listeners.add(first)  # added once, however often
    listeners.add(Listener("b", seen))
    out = hook().fit("data", None, 2, ["mine"])  # positional arguments are bound by name
    assert out == {"x": "data", "epochs": 2, "callbacks": ["mine", "a", "b"], "verbose": "auto"}
    assert seen == ["before a", "before b", "after b ok", "after a ok"]
    seen.clear()
    with pytest.raises(RuntimeError, match="fit failed"):
        hook().fit("boom")
    assert seen == ["before a", "before b", "after b RuntimeError", "after a RuntimeError"]
    with pytest.raises(TypeError):
        hook().fit(nonsense=1)  # fit's own error for a wrong call, as without the hook


def test_a_listener_may_change_the_arguments_or_end_the_process_before_fit(hook: type, listeners: Listeners) -> None:
    seen: list[str] = []

    class Stop(Listener):
        def before(self, call: fit_hook.FitCall) -> None:
            super().before(call)
            call.arguments["epochs"] = 1
            if call.arguments["x"] == "stop":
                raise SystemExit(0)

    listeners.add(Listener("first", seen))
    listeners.add(Stop("stop", seen))
    listeners.add(Listener("never", seen))
    assert hook().fit("data", epochs=9)["epochs"] == 1
    seen.clear()
    with pytest.raises(SystemExit):
        hook().fit("stop")
    assert seen == ["before first", "before stop", "after stop SystemExit", "after first SystemExit"]


def test_the_command_line_passes_every_listener_and_a_parsers_own_list_none(monkeypatch: pytest.MonkeyPatch) -> None:
    parser_cls = type("ArgumentParser", (argparse.ArgumentParser,), {})
    listeners: Listeners[arguments.Listener] = Listeners(lambda: arguments.wrap(parser_cls, listeners))
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "3", "--extra", "x"])
    seen: list[tuple[int, list[str]]] = []

    def keep(ns: argparse.Namespace, extras: list[str]) -> list[str]:
        seen.append((ns.epochs, extras))
        return extras

    listeners.add(keep)
    listeners.add(lambda _ns, extras: [e for e in extras if e not in ("--extra", "x")])
    parser = parser_cls()
    parser.add_argument("--epochs", type=int)
    assert parser.parse_args().epochs == 3  # the second listener dropped what the parser would refuse
    assert parser.parse_args(sys.argv[1:]).epochs == 3  # the command line given as a list is the command line
    assert seen == [(3, ["--extra", "x"]), (3, ["--extra", "x"])]
    with pytest.raises(SystemExit):
        parser.parse_args(["--epochs", "1", "--extra", "x"])  # a list of its own: left alone, refused as usual
    assert len(seen) == 2


def test_the_data_set_is_replaced_wherever_a_script_imports_it_from_and_replacements_chain() -> None:
    def real() -> str:
        return "real"

    src = types.ModuleType("src_fashion_mnist")
    public = types.ModuleType("public_fashion_mnist")
    other = types.ModuleType("unrelated")
    src.load_data = public.load_data = real
    other.load_data = lambda: "other"
    names = {"lk_test_src": src, "lk_test_public": public, "lk_test_other": other}
    sys.modules.update(names)
    try:
        dataset.hook(lambda r: lambda: f"small {r()}")(src)
        assert src.load_data() == public.load_data() == "small real" and other.load_data() == "other"
        dataset.hook(lambda r: lambda: f"first of {r()}")(src)  # a second replacement wraps the first
        assert src.load_data() == public.load_data() == "first of small real"
    finally:
        for name in names:
            sys.modules.pop(name)


def test_convolutions_are_narrowed_when_built_but_not_when_rebuilt_nor_tf_keras_subclasses() -> None:
    class Conv2D:
        def __init__(self, filters: int, kernel: int = 3) -> None:
            self.filters, self.kernel = filters, kernel

        @classmethod
        def from_config(cls, config: dict) -> Conv2D:
            return cls(**config)

    Conv2D.__module__ = "lk_keras.layers"
    transpose = type("Conv2DTranspose", (Conv2D,), {"__module__": "lk_keras.layers.transpose"})
    mine = type("MyConv", (Conv2D,), {"__module__": "learner_script"})
    conv.narrow_class(Conv2D, lambda f: f // 8)
    assert Conv2D(160).filters == 20 and Conv2D(filters=64, kernel=1).filters == 8
    assert Conv2D.from_config({"filters": 20, "kernel": 3}).filters == 20  # a saved layer keeps its filters
    assert Conv2D(160).filters == 20  # and building narrows again afterwards
    assert transpose(160).filters == 160 and mine(160).filters == 20


def test_tf_keras_hooks_narrow_the_model_replace_the_data_and_load_a_saved_model_back(tmp_path) -> None:  # noqa: ANN001
    """The hooks on tf-keras itself, installed before TensorFlow loads as the observer does; in a process of
    its own so that this one stays unpatched."""
    code = textwrap.dedent('''
        from labkit.instrument.observer import OBSERVER
        OBSERVER.narrow(lambda f: max(8, f // 8))
        OBSERVER.replace_data(lambda real: lambda: "replaced")
        class Note:
            def before(self, call):
                call.arguments["epochs"] = 1
                print("fit", call.arguments["x"].shape[0])
            def after(self, call):
                print("after", call.error)
        OBSERVER.fit.add(Note())
        import numpy as np
        import tensorflow as tf
        from tensorflow.keras.datasets import fashion_mnist
        print("data", fashion_mnist.load_data(), tf.keras.datasets.fashion_mnist.load_data())
        model = tf.keras.Sequential([tf.keras.layers.Input((8, 8, 1)), tf.keras.layers.Conv2D(64, 3),
                                     tf.keras.layers.Convolution2D(filters=160, kernel_size=1),
                                     tf.keras.layers.Conv2DTranspose(32, 3),
                                     tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(2)])
        print("filters", [getattr(l, "filters", None) for l in model.layers])
        model.compile("sgd", "mse")
        model.fit(np.zeros((4, 8, 8, 1)), np.zeros((4, 2)), epochs=5, verbose=0)
        model.save("m.keras")
        back = tf.keras.models.load_model("m.keras")
        print("loaded", [getattr(l, "filters", None) for l in back.layers])
    ''')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}, "TF_USE_LEGACY_KERAS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "data replaced replaced" in lines
    assert "filters [8, 20, 32, None, None]" in lines and "loaded [8, 20, 32, None, None]" in lines
    assert "fit 4" in lines and "after None" in lines
