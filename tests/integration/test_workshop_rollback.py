"""``labkit workshop up`` that fails half-way (here: the hub cannot start) removes every user, group, home,
permission change and file it made, and a later ``down`` finds nothing. Needs root; skipped otherwise."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
from pathlib import Path

import pytest

from labkit.workshop import accounts, hub, lifecycle

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("openssl") is None or shutil.which("useradd") is None,
                                reason="needs root, useradd and openssl")


def _snapshot() -> tuple[set[str], set[str], set[str], int]:
    return ({p.pw_name for p in pwd.getpwall()}, {g.gr_name for g in grp.getgrall()}, set(os.listdir("/home")),
            os.stat("/root").st_mode)


def test_a_failed_up_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    if accounts.user_exists("learner01") or lifecycle.State.load() is not None:
        pytest.skip("a workshop is up on this machine")
    state = Path(f"/run/labkit-workshop-rollback-{os.getpid()}")
    before = _snapshot()

    def no_hub(*args: object) -> int:
        assert accounts.user_exists("learner02") and (state / "class" / "learner02.jsonl").exists()
        raise hub.HubError("the hub did not start (the test says so)")

    monkeypatch.setattr(hub, "find_proxy", lambda: "/bin/true")
    monkeypatch.setattr(hub, "jupyterhub", lambda: "/bin/true")
    monkeypatch.setattr(hub, "start", no_hub)
    with pytest.raises(hub.HubError, match="the test says so"):
        lifecycle.up(lifecycle.Plan(2, port=1, folder=str(state)), say=print)
    assert _snapshot() == before and not state.exists()
    assert lifecycle.down(str(state)) == []
