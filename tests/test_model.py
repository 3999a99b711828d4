"""labkit.model: the WideResNet and the small/full modes."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from labkit import model as wrn

WRN_16_10_PARAMS = 17_130_954


def test_stage_widths():
    assert wrn.stage_widths(1) == (16, 32, 64)
    assert wrn.stage_widths(10) == (160, 320, 640)
    assert wrn.stage_widths(wrn.FULL_WIDEN) == (160, 320, 640)


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_widen_factor_raises(bad):
    with pytest.raises(ValueError, match="widen factor"):
        wrn.stage_widths(bad)
    with pytest.raises(ValueError, match="widen factor"):
        wrn.count_params(bad)
    with pytest.raises(ValueError, match="widen factor"):
        wrn.build(bad)


def test_count_params_of_the_lab_model():
    assert wrn.count_params(10) == WRN_16_10_PARAMS
    assert wrn.count_params(1) < wrn.count_params(2) < wrn.count_params(10)


def test_built_wrn_16_10_has_the_same_count():
    # Building (not training) the full model takes a few seconds on a CPU.
    model = wrn.build(10)
    assert model.count_params() == WRN_16_10_PARAMS
    assert model.name == "wrn_16_10"
    assert model.output_shape == (None, 10)


def test_small_model_outputs_class_probabilities():
    model = wrn.build(wrn.SMALL_WIDEN)
    assert model.count_params() == wrn.count_params(wrn.SMALL_WIDEN)
    x = np.random.default_rng(0).normal(size=(3, 28, 28, 1)).astype(np.float32)
    p = model(x, training=False).numpy()
    assert p.shape == (3, 10)
    assert (p >= 0).all()
    np.testing.assert_allclose(p.sum(axis=1), np.ones(3), rtol=1e-5)


def test_weight_decay_adds_regularisation_losses():
    assert not wrn.build(1).losses
    assert len(wrn.build(1, weight_decay=1e-4).losses) > 0


def test_resolve_mode_reads_labkit_mode(monkeypatch):
    monkeypatch.setenv("LABKIT_MODE", "full")
    assert wrn.resolve_mode() == "full"
    assert wrn.resolve_mode("auto") == "full"
    monkeypatch.setenv("LABKIT_MODE", "small")
    assert wrn.resolve_mode() == "small"
    assert wrn.resolve_mode("full") == "full"  # an explicit mode wins over the variable
    monkeypatch.setenv("LABKIT_MODE", "huge")
    with pytest.raises(ValueError, match="unknown mode"):
        wrn.resolve_mode()
    with pytest.raises(ValueError, match="unknown mode"):
        wrn.resolve_mode("medium")


def test_auto_mode_follows_the_gpus(monkeypatch):
    import tensorflow as tf

    monkeypatch.delenv("LABKIT_MODE", raising=False)
    expected = "full" if tf.config.list_physical_devices("GPU") else "small"
    assert wrn.resolve_mode() == expected
    monkeypatch.setenv("LABKIT_MODE", "auto")
    assert wrn.resolve_mode() == expected


def test_apply_mode_fills_only_what_is_unset(monkeypatch):
    monkeypatch.setenv("LABKIT_MODE", "small")
    args = wrn.apply_mode(argparse.Namespace(mode="auto", widen_factor=None, train_size=500, test_size=None))
    assert (args.mode, args.widen_factor, args.train_size, args.test_size) == ("small", 1, 500, 1000)

    args = wrn.apply_mode(argparse.Namespace(mode="full", widen_factor=4, train_size=None, test_size=None))
    assert (args.mode, args.widen_factor, args.train_size, args.test_size) == ("full", 4, None, None)

    args = wrn.apply_mode(argparse.Namespace(mode="full", widen_factor=None, train_size=None, test_size=None))
    assert args.widen_factor == wrn.FULL_WIDEN == 10
