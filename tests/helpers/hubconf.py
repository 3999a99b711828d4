"""A workshop hub's settings for unit tests, and the configuration file they write, loaded as JupyterHub loads it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from labkit.workshop import hubconfig


def settings(tmp_path: Path, **kw: object) -> hubconfig.HubSettings:
    base = dict(state=tmp_path, port=8123, hub_port=8124, proxy_api_port=8125, service_port=8126,
                learners=["learner01", "learner02"], instructor="instructor", release=tmp_path / "release",
                class_dir=tmp_path / "class", python=sys.executable, proxy="/usr/bin/configurable-http-proxy",
                logins=tmp_path / "logins")
    return hubconfig.HubSettings(**{**base, **kw})


def load(text: str) -> object:
    traitlets = pytest.importorskip("traitlets.config")
    config = traitlets.Config()
    exec(compile(text, "jupyterhub_config.py", "exec"), {"get_config": lambda: config})  # noqa: S102
    return config
