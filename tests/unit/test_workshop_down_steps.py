"""``workshop down`` never ends in an error of one of its steps: it says the failure, runs the other steps, keeps
the state while something of the workshop is left, and a second ``down`` finishes. No account is touched here:
the steps that would are replaced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labkit.workshop import accounts, lifecycle, limits
from labkit.workshop.state import State


def test_a_failing_step_is_said_the_others_run_and_a_second_down_finishes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    ran: list[str] = []

    def cgroups_fail(names: list[str]) -> list[str]:
        ran.append("end")
        raise RecursionError("maximum recursion depth exceeded")  # not even an OSError: said all the same

    def accounts_fail(made: dict, save: object) -> list[str]:
        ran.append("accounts")
        raise OSError(5, "Input/output error")

    def accounts_done(made: dict, save) -> list[str]:
        made["users"], made["groups"] = [], []
        save()
        return ["user learner01"]

    monkeypatch.setattr(limits, "end", cgroups_fail)
    monkeypatch.setattr(limits, "remove", lambda names: ran.append("remove") or [])
    monkeypatch.setattr(limits, "left", lambda names: [])
    monkeypatch.setattr(accounts, "remove", accounts_fail)
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / "queue").mkdir()
    fd = os.open(folder / "queue", os.O_RDONLY)
    for _ in range(1200):  # what a learner could leave in the queue: deeper than Python's recursion limit
        os.mkdir("d", dir_fd=fd)
        down = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = down
    os.close(fd)
    st = State(folder, ["learner01"], made={"folder": True, "users": ["learner01"], "groups": ["labkit-learners"],
                                            "cgroups": ["learner01"]})
    st.save()
    said = lifecycle.down(str(folder))
    assert ran == ["end", "accounts", "remove"]
    assert any("failed (RecursionError" in s for s in said) and any("failed (OSError" in s for s in said)
    assert any("is kept for the next `labkit workshop down`" in s for s in said) and folder.is_dir()
    assert State.load(folder).made["users"] == ["learner01"]
    monkeypatch.setattr(limits, "end", lambda names: [])
    monkeypatch.setattr(accounts, "remove", accounts_done)
    said = lifecycle.down(str(folder))
    assert said == ["user learner01", str(folder)] and not folder.exists()
    assert lifecycle.down(str(folder)) == []
