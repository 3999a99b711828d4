"""labkit.core.env: the environment every lab process needs before TensorFlow is imported."""

from __future__ import annotations

import os
import subprocess
import sys

from labkit.core import env


def test_defaults_are_what_the_lab_needs():
    assert env.DEFAULTS["TF_USE_LEGACY_KERAS"] == "1"
    assert env.DEFAULTS["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_apply_defaults_fills_missing_values_only():
    environ = {"TF_CPP_MIN_LOG_LEVEL": "0", "OTHER": "x"}
    out = env.apply_defaults(environ)
    assert out is environ
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "0", "OTHER": "x", "TF_USE_LEGACY_KERAS": "1"}


def test_apply_defaults_on_os_environ(monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    assert env.apply_defaults() is os.environ
    assert os.environ["TF_USE_LEGACY_KERAS"] == "1"
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"


def test_thread_env():
    e = env.thread_env(3)
    assert set(e) == {
        "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
    }
    assert set(e.values()) == {"3"}
    assert env.thread_env(0)["OMP_NUM_THREADS"] == "1"  # never zero threads
    assert env.thread_env("2")["TF_NUM_INTRAOP_THREADS"] == "2"


def test_is_noise():
    assert env.is_noise("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR")
    assert env.is_noise("I0000 00:00:17.1 5059 cudart_stub.cc:31] Could not find cuda drivers on your machine")
    assert env.is_noise("I0000 port.cc:153] oneDNN custom operations are on. You may see slightly different")
    assert not env.is_noise("Images/sec: 161.9")
    assert not env.is_noise("Test accuracy: 0.8123")
    assert not env.is_noise("Traceback (most recent call last):")


def test_keras_problem_when_the_variable_is_missing(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    assert "TF_USE_LEGACY_KERAS" in env.keras_problem()


def test_keras_is_keras_2_here():
    import tensorflow as tf

    assert env.keras_problem() is None
    assert tf.keras.__name__.startswith("tf_keras")


def test_pth_line_sets_the_defaults_at_start_up(tmp_path):
    path = env.install_pth(str(tmp_path))
    assert path == str(tmp_path / env.PTH_NAME)
    assert (tmp_path / env.PTH_NAME).read_text() == env.PTH_LINE
    assert env.PTH_LINE.startswith("import ")  # site.py only executes lines that start so
    assert env.PTH_LINE.count("\n") == 1

    child_env = {k: v for k, v in os.environ.items() if k not in env.DEFAULTS}
    child_env["TF_CPP_MIN_LOG_LEVEL"] = "1"  # set already: the hook must keep it
    # .venv's own start-up hook may have run already, so the child clears the variable
    # before it processes the site folder holding the new .pth file.
    code = (
        "import os, site; os.environ.pop('TF_USE_LEGACY_KERAS', None); "
        "before = os.environ.get('TF_USE_LEGACY_KERAS'); "
        f"site.addsitedir({str(tmp_path)!r}); "
        "print(before, os.environ['TF_USE_LEGACY_KERAS'], os.environ['TF_CPP_MIN_LOG_LEVEL'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "1", "1"]


def test_setting_restores_the_value_before_or_its_absence(monkeypatch) -> None:
    monkeypatch.setenv("LABKIT_TEST_SETTING", "before")
    monkeypatch.delenv("LABKIT_TEST_ABSENT", raising=False)
    with env.setting("LABKIT_TEST_SETTING", "inside"), env.setting("LABKIT_TEST_ABSENT", "inside"):
        assert os.environ["LABKIT_TEST_SETTING"] == os.environ["LABKIT_TEST_ABSENT"] == "inside"
    assert os.environ["LABKIT_TEST_SETTING"] == "before" and "LABKIT_TEST_ABSENT" not in os.environ
    try:
        with env.setting("LABKIT_TEST_SETTING", "inside"):
            raise KeyError("boom")
    except KeyError:
        pass
    assert os.environ["LABKIT_TEST_SETTING"] == "before"
