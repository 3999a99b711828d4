"""The WideResNet and the small/full modes, as the lab scripts define them."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from types import ModuleType

import numpy as np
import pytest
from helpers import paths

from labkit.instrument import model as sizes

STARTER = paths.LABS / "fashion_mnist.py"
WRN_16_10_PARAMS = 17_130_954


@pytest.fixture(scope="module")
def script() -> ModuleType:
    """The single-process starter, imported as a module (its main() does not run)."""
    spec = importlib.util.spec_from_file_location("lab_starter", STARTER)
    module = importlib.util.module_from_spec(spec)
    sys.modules["lab_starter"] = module
    spec.loader.exec_module(module)
    return module


def test_stage_widths():
    assert sizes.stage_widths(1) == (16, 32, 64)
    assert sizes.stage_widths(sizes.FULL_WIDEN) == (160, 320, 640)
    with pytest.raises(ValueError, match="widen factor"):
        sizes.count_params(0)


def test_the_scripts_wrn_16_10_has_the_labs_size(script):
    # Building (not training) the full model takes a few seconds on a CPU.
    model = script.wide_resnet(10, weight_decay=0.0)
    assert model.count_params() == WRN_16_10_PARAMS == sizes.count_params(10)
    assert model.name == "wrn_16_10"
    assert model.output_shape == (None, 10)
    widths = [layer.filters for layer in model.layers if type(layer).__name__ == "Conv2D"]
    assert {160, 320, 640} <= set(widths)


def test_small_model_outputs_class_probabilities(script):
    model = script.wide_resnet(1, weight_decay=0.0)
    assert model.count_params() == sizes.count_params(1)
    x = np.random.default_rng(0).normal(size=(3, 28, 28, 1)).astype(np.float32)
    p = model(x, training=False).numpy()
    assert p.shape == (3, 10)
    assert (p >= 0).all()
    np.testing.assert_allclose(p.sum(axis=1), np.ones(3), rtol=1e-5)


def test_weight_decay_adds_regularisation_losses(script):
    assert not script.wide_resnet(1, weight_decay=0.0).losses
    assert len(script.wide_resnet(1, weight_decay=1e-4).losses) > 0


def test_auto_mode_follows_the_gpus_and_fills_only_what_is_unset(script):
    import tensorflow as tf

    args = script.parse_args([])
    assert args.mode == ("full" if tf.config.list_physical_devices("GPU") else "small")
    args = script.parse_args(["--mode", "small", "--train-size", "500"])
    assert (args.widen_factor, args.train_size, args.test_size) == (1, 500, 1000)
    assert (args.base_lr, args.target_accuracy) == (0.05, 0.82)
    args = script.parse_args(["--mode", "full", "--widen-factor", "4", "--base-lr", "0.2"])
    assert (args.widen_factor, args.train_size, args.test_size, args.base_lr) == (4, 0, 0, 0.2)
    with pytest.raises(SystemExit):
        script.parse_args(["--mode", "medium"])
    assert isinstance(args, argparse.Namespace)


def test_augmentation_keeps_shapes_and_flips_or_shifts(script):
    import tensorflow as tf

    x = tf.constant(np.arange(4 * 28 * 28, dtype=np.float32).reshape(4, 28, 28, 1))
    y = tf.zeros([4, 10])
    out, labels = script.augment(x, y)
    assert out.shape == x.shape and labels is y
    # Every output pixel is one of the same image's pixels (flips and nearest-fill shifts only).
    for i in range(4):
        assert set(np.unique(out[i].numpy())) <= set(np.unique(x[i].numpy()))


def test_pipeline_helpers_standardise_and_one_hot(script):
    import tensorflow as tf

    x, y = script.standardize(10.0, 2.0)(tf.constant([[12]], tf.uint8), tf.constant([3], tf.uint8))
    assert float(x.numpy()[0, 0]) == 1.0
    assert y.numpy().tolist() == [[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]]
