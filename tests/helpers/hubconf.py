"""A workshop hub's settings for unit tests, the configuration file they write, loaded as JupyterHub loads it,
and what a real hub in a test needs."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from labkit.workshop import hub, hubconfig


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


def hub_missing() -> str | None:
    """Why a real workshop hub cannot run here (root, JupyterHub, a proxy or npm, useradd), or None."""
    if os.geteuid() != 0:
        return "a workshop needs root (Unix users, JupyterHub as root)"
    if not (Path(sys.executable).parent / "jupyterhub").exists():
        return "JupyterHub is not installed: pip install -e '.[workshop]'"
    if hub.find_proxy() is None and shutil.which("npm") is None:
        return "neither configurable-http-proxy nor npm to install it"
    if shutil.which("useradd") is None:
        return "useradd is missing"
    return None
