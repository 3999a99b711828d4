"""A workshop for real: JupyterHub with three learners, two of them logged in through Debian's chromium, a
check run in each learner's own JupyterLab terminal (one passing, one failing), both seen on the instructor's
class page; learners kept apart; ``down`` leaving no user, process or file. Needs root, JupyterHub, npm (or
configurable-http-proxy), openssl, Playwright and chromium; skipped otherwise. Prints the time from login to a
running JupyterLab for each learner."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import browser, hubpage, paths
from helpers.hubconf import hub_missing

from labkit.core import proc, tfconfig
from labkit.records import classlog
from labkit.workshop import accounts, leftovers, lifecycle, limits

ROOT = paths.ROOT
SOLUTION = ROOT / "solutions" / "fashion_mnist_after_step_01.py"


def _missing() -> str | None:
    if hub_missing() is not None:
        return hub_missing()
    if shutil.which("openssl") is None:
        return "openssl is missing"
    if "classlog" not in (ROOT / "labkit" / "check" / "__init__.py").read_text():
        return "labkit.check does not write class records yet (labkit.records.classlog.record_check)"
    return browser.missing()


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]

def _snapshot() -> dict[str, object]:
    return {"users": {p.pw_name for p in pwd.getpwall()}, "groups": {g.gr_name for g in grp.getgrall()},
            "homes": set(os.listdir("/home")), "root_mode": os.stat("/root").st_mode}


@pytest.fixture(scope="module")
def workshop() -> Iterator[tuple[lifecycle.State, dict[str, str]]]:
    state = Path(f"/run/labkit-workshop-test-{os.getpid()}")  # learners reach data/ and class/ below it
    if lifecycle.State.load() is not None or accounts.user_exists("learner01") or state.exists():
        pytest.skip("a workshop is up on this machine already")
    before = _snapshot()
    uids: set[int] = set()
    job = ""
    try:
        plan = lifecycle.Plan(3, port=tfconfig.free_ports(1)[0], folder=str(state), cores=1.5, memory="3G")
        st, pw = lifecycle.up(plan, say=print)
        uids, job = accounts.uids_of(st.made["users"]), st.job_id
        yield st, pw
    finally:
        removed = lifecycle.down(str(state))
        assert lifecycle.down(str(state)) == []  # safe twice
        after = _snapshot()
        for kind in ("users", "groups", "homes"):
            assert after[kind] == before[kind], (kind, removed)
        assert after["root_mode"] == before["root_mode"] and not state.exists()
        assert len(uids) == 4 and leftovers.processes_of(uids) == [] and leftovers.temp_files(uids) == []
        assert [b for b in limits.bases().values() if b.exists()] == []  # no control group left behind
        assert proc.marked(job) == []  # the hub and its proxy
        cmdlines = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
        assert [c for c in cmdlines if str(state) in c] == []


def _limited(who: str) -> None:
    """Every process of ``who`` (the server, its kernel) is in the learner's control groups, with the limits."""
    bases = limits.bases()
    if not bases:
        return  # `up` said so: no writable control groups here
    for p in leftovers.processes_of(accounts.uids_of([who])):
        lines = Path(f"/proc/{p.pid}/cgroup").read_text()
        assert f"{limits.FOLDER}/{who}" in lines, (p.cmdline(), lines)
    if "v2" in bases:
        assert (bases["v2"] / who / "cpu.max").read_text().split() == ["150000", "100000"]
        assert int((bases["v2"] / who / "memory.max").read_text()) == 3 * 2**30
    else:
        assert int((bases["cpu"] / who / "cpu.cfs_quota_us").read_text()) == 150000
        assert int((bases["memory"] / who / "memory.limit_in_bytes").read_text()) == 3 * 2**30
        assert int((bases["pids"] / who / "pids.max").read_text()) == limits.DEFAULT_PIDS


def _checking(who: str) -> bool:
    """True while a ``labkit check`` of ``who`` runs (or has not started yet: its output file is missing)."""
    if not (Path(pwd.getpwnam(who).pw_dir) / "course" / "labs" / "check.out").exists():
        return True
    for p in leftovers.processes_of(accounts.uids_of([who])):
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "labkit" in line and " check " in line:
            return True
    return False


def _records(st: lifecycle.State, who: str) -> list[classlog.Record]:
    return classlog.read_file(st.class_dir / f"{who}{classlog.SUFFIX}").records  # the file's owner's


def test_learners_check_and_the_instructor_sees_them(workshop: tuple[lifecycle.State, dict[str, str]]) -> None:
    st, pw = workshop
    home1 = Path(pwd.getpwnam("learner01").pw_dir)
    took = {}
    with browser.browser() as one, browser.browser() as two:
        took["learner01"] = hubpage.login(one, st.url, "learner01", pw["learner01"])
        took["learner02"] = hubpage.login(two, st.url, "learner02", pw["learner02"])
        print(f"\nworkshop up: {st.seconds_up} s; login to a running JupyterLab: "
              f"{json.dumps({k: round(v, 1) for k, v in took.items()})} s")
        _limited("learner01")
        shell = hubpage.terminal(one, "learner01",
                                 'echo "SHELL-IS $SHELL $(id -un) $(getent passwd learner01 | cut -d: -f7)"')
        assert "SHELL-IS /bin/bash learner01 /usr/sbin/nologin" in shell, shell  # bash here, nologin for ssh
        script = home1 / "course" / "labs" / "fashion_mnist.py"
        assert script.is_file() and not (home1 / "course" / "solutions").exists()
        assert script.stat().st_uid == pwd.getpwnam("learner01").pw_uid
        # learner01 has finished step 1 (the step's reference solution); learner02 has the untouched starter
        script.write_bytes(SOLUTION.read_bytes())
        check = "cd ~/course/labs && (nohup labkit check horovod fashion_mnist.py --step 1 > check.out 2>&1 &)"
        for page, who in ((one, "learner01"), (two, "learner02")):
            hubpage.terminal(page, who, check)
        proc.wait_until(lambda: all(_records(st, w) or not _checking(w) for w in ("learner01", "learner02")), 600,
                        every=2)
        outs = {w: (Path(pwd.getpwnam(w).pw_dir) / "course" / "labs" / "check.out").read_text(errors="replace")
                for w in ("learner01", "learner02")}
        assert [(r.step, r.passed) for r in _records(st, "learner01")] == [(1, True)], outs
        assert "all steps pass" in outs["learner01"] and "fix step 1 first" in outs["learner02"], outs
        assert [(r.step, r.passed) for r in _records(st, "learner02")] == [(1, False)]
        # apart: another's server, files, records, processes, and the class page are closed to a learner
        out = hubpage.terminal(one, "learner01", "cat ~learner02/course/labs/fashion_mnist.py; ls " + str(st.class_dir)
                        + "; cat " + str(st.class_dir / "learner02.jsonl") + "; kill -0 $(pgrep -u learner02 -o)")
        assert out.count("Permission denied") == 3 and "Operation not permitted" in out, out
        one.goto(st.url + "user/learner02/lab", timeout=60_000)
        assert "403" in one.content() or "permission" in one.content().lower()
        assert "jp-main-dock-panel" not in one.content()
        response = one.goto(st.url + "services/class/", timeout=60_000)
        assert response is not None and response.status == 403 and "learner02" not in one.content()
    with browser.browser() as teacher:
        hubpage.login(teacher, st.url, "instructor", pw["instructor"])
        teacher.goto(st.url + "services/class/", timeout=60_000)
        grid = teacher.inner_text("#grid")
        assert "horovod/1" in grid and "learner01" in grid and "learner02" in grid and "learner03" in grid
        assert "stuck at horovod/1" in teacher.inner_html("#grid")
        row = {line.split()[0]: line for line in grid.splitlines() if line.startswith("learner")}
        assert "✔" in row["learner01"] and "✘" in row["learner02"] and "✔" not in row["learner03"]
        assert "Horovod was not initialised" in teacher.content()  # the commonest failure of step 1
        data = json.loads(teacher.goto(st.url + "services/class/json").text())
        assert data["stuck_at"] == {"learner01": None, "learner02": "horovod/1", "learner03": None}
    status = lifecycle.status(st.folder)
    assert status["state"] == "up" and [w["course"] for w in status["learners"]] == [True, True, False]
