"""The systemd path of the workshop's limits (labkit.workshop.scopes): the ``systemd-run`` command a learner's
server starts with, how ``systemctl show``'s answer is read, and where the spawner and ``up`` take this path
instead of the control groups. No systemd needed: tests/integration/test_workshop_systemd.py boots one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import aio

from labkit.workshop import scopes
from labkit.workshop.limits import Limits


def test_the_command_runs_the_server_as_the_learner_in_their_scope_with_every_limit() -> None:
    argv = scopes.argv("learner07", Limits(1.5, 256 * 2**20, 64))
    assert argv[:2] == ["systemd-run", "--scope"] and argv[-1] == "--"
    assert "--unit=labkit-workshop-learner07.scope" in argv and "--uid=learner07" in argv
    assert "--collect" in argv  # a scope ended by the OOM killer is not left behind, blocking the name
    props = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert props == ["CPUQuota=150%", "MemoryMax=268435456", "TasksMax=64"]
    assert not any(a.startswith("--gid") for a in argv)  # the learner's own primary group, from --uid
    assert scopes.argv("learner07", Limits(1.5, 256 * 2**20, 64)) == argv  # reads no state


def test_only_the_limits_asked_for_are_set() -> None:
    argv = scopes.argv("learner01", Limits(pids=2048))
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-p"] == ["TasksMax=2048"]
    assert "-p" not in scopes.argv("learner01", Limits())


def test_the_probe_s_scope_runs_as_the_caller() -> None:
    argv = scopes.argv("probe-42", Limits(memory=2**30), as_learner=False)
    assert "--unit=labkit-workshop-probe-42.scope" in argv
    assert not any(a.startswith("--uid") for a in argv)


@pytest.mark.parametrize(("cores", "quota"), [(1.5, "150%"), (2, "200%"), (0.01, "1%"), (0.333, "33.3%"),
                                              (1.2345, "123.45%"), (64, "6400%")])
def test_cores_become_a_cpu_quota_in_percent(cores: float, quota: str) -> None:
    assert scopes.percent(cores) == quota


@pytest.mark.parametrize("name", ["", "Learner01", "learner01.scope", "a/b", "x" * 40, "--uid=root", "1abc",
                                  "learner 01"])
def test_a_name_that_is_no_plain_user_name_gets_no_scope(name: str) -> None:
    with pytest.raises(ValueError):
        scopes.argv(name, Limits(pids=64))


@pytest.mark.parametrize(("span", "seconds"), [("1.500000s", 1.5), ("1s 500ms", 1.5), ("150ms", 0.15),
                                               ("2s", 2.0), ("1min 30s", 90.0), ("infinity", None), ("", None)])
def test_systemd_time_spans_are_read(span: str, seconds: float | None) -> None:
    assert scopes.seconds(span) == seconds


def test_the_properties_shown_are_compared_with_the_limits_asked() -> None:
    asked = Limits(1.5, 256 * 2**20, 64)
    good = {"CPUQuotaPerSecUSec": "1.500000s", "MemoryMax": "268435456", "TasksMax": "64"}
    assert scopes.mismatches(good, asked) == []
    bad = {"CPUQuotaPerSecUSec": "infinity", "MemoryMax": "infinity", "TasksMax": "4915"}
    wrong = scopes.mismatches(bad, asked)
    assert len(wrong) == 3 and "CPUQuotaPerSecUSec" in wrong[0] and "MemoryMax" in wrong[1]
    assert scopes.mismatches({}, Limits()) == []


def test_systemd_is_available_only_where_it_is_pid_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(scopes, "RUNTIME", tmp_path / "missing")
    assert scopes.available() is False
    assert scopes.probe(Limits(pids=64)) is not None  # a refusal that says why, not a pass
    assert scopes.probe(Limits()) is None  # nothing asked, nothing to probe


ended: list[str] = []  # the learners whose scope the spawner stopped


def _spawner(monkeypatch: pytest.MonkeyPatch, systemd: bool, **limits: object):
    """A workshop spawner for nobody (a user that exists everywhere) whose start runs nothing: the home is not
    prepared, no control group is made, and LocalProcessSpawner.start only records the command and the
    preexec_fn it would use."""
    from jupyterhub.spawner import LocalProcessSpawner

    from labkit.workshop import homes, spawner

    monkeypatch.setattr(scopes, "available", lambda: systemd)
    monkeypatch.setattr(scopes, "end", ended.append)
    monkeypatch.setattr(homes, "give", lambda *a: homes.Report())
    monkeypatch.setattr(scopes, "preexec", lambda name, asked: ("scope", name, asked))
    monkeypatch.setattr(spawner.limits, "make", lambda name, asked: ([], None))  # no control group made here
    seen: dict[str, object] = {}

    async def start(self):  # noqa: ANN001, ANN202
        seen.update(cmd=list(self.cmd), preexec=self.make_preexec_fn(self.user.name))
        return ("127.0.0.1", 1)

    monkeypatch.setattr(LocalProcessSpawner, "start", start)
    user = SimpleNamespace(name="nobody", url="/user/nobody/")
    return spawner.WorkshopSpawner(user=user, release_dir="/nonexistent", **limits), seen


def _world() -> list[str]:
    from labkit.workshop import readonly, worlds

    return worlds.argv(worlds.World(65534, 65534, "/nonexistent", keep=worlds.kept(readonly.venv())))


def test_on_a_systemd_host_the_server_starts_through_systemd_run_in_the_learner_s_scope(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ended.clear()
    hub_spawner, seen = _spawner(monkeypatch, True, cpu_limit=1.5, mem_limit=2**30, pids_limit=64)
    aio.run(hub_spawner.start())
    # systemd's scope (as root), then the learner's world, which becomes the learner
    assert seen["cmd"] == [*scopes.argv("nobody", Limits(1.5, 2**30, 64), as_learner=False), *_world(),
                           "jupyterhub-singleuser"]
    assert hub_spawner.cmd == ["jupyterhub-singleuser"]  # the prefix is not added twice on the next start
    assert ended == ["nobody"]  # the previous scope, if any, stopped first
    assert seen["preexec"] == ("scope", "nobody", Limits(1.5, 2**30, 64))  # groups, task cap, home; no setuid


def test_elsewhere_or_without_limits_the_server_starts_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    ended.clear()
    for systemd, limits in ((False, {"pids_limit": 64}), (True, {})):
        hub_spawner, seen = _spawner(monkeypatch, systemd, **limits)
        aio.run(hub_spawner.start())
        assert seen["cmd"] == [*_world(), "jupyterhub-singleuser"] and ended == []
        assert callable(seen["preexec"])  # control groups joined as root; the world's setpriv becomes the learner


def test_up_probes_systemd_s_scope_on_a_systemd_host_and_the_control_groups_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.workshop import lifecycle, limits

    monkeypatch.setattr(scopes, "probe", lambda asked: "scope refused")
    monkeypatch.setattr(limits, "probe", lambda asked: "group refused")
    for systemd, said in ((True, "scope refused"), (False, "group refused")):
        monkeypatch.setattr(scopes, "available", lambda systemd=systemd: systemd)
        with pytest.raises(lifecycle.WorkshopError, match=said):
            lifecycle.enforceable(Limits(pids=64), no_limits=False)
    assert "--no-limits" in lifecycle.enforceable(Limits(pids=64), no_limits=True)


@pytest.mark.parametrize(("text", "period", "cores"), [("150000 100000", None, 1.5), ("max 100000", None, None),
                                                       ("123460", "100000", 1.2346), ("-1", "100000", None),
                                                       ("", None, None)])
def test_kernel_cpu_quotas_are_read_in_cores(text: str, period: str | None, cores: float | None) -> None:
    assert scopes.quota(text, period) == cores


def _group(root: Path, files: dict[str, str]) -> None:
    root.mkdir(parents=True)
    for name, value in files.items():
        (root / name).write_text(value + "\n")


def test_the_kernel_s_files_of_the_scope_are_read_back_on_v1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from labkit.workshop import limits

    monkeypatch.setattr(limits, "CGROUP", tmp_path)
    scope = "/system.slice/labkit-workshop-probe-1.scope"
    asked = Limits(1.23456, 256 * 2**20, 64)  # systemd can only say 123.46%: close enough
    assert scopes.percent(asked.cores) == "123.46%"
    _group(tmp_path / "cpu" / scope[1:], {"cpu.cfs_quota_us": "123460", "cpu.cfs_period_us": "100000"})
    _group(tmp_path / "memory" / scope[1:], {"memory.limit_in_bytes": str(256 * 2**20)})
    assert scopes._kernel(scope, Limits(1.23456, 256 * 2**20)) == []
    wrong = scopes._kernel(scope, asked)  # no pids group: systemd could not make one
    assert len(wrong) == 1 and "no pids group" in wrong[0]
    (tmp_path / "cpu" / scope[1:] / "cpu.cfs_quota_us").write_text("-1\n")
    assert "CPU quota" in scopes._kernel(scope, Limits(cores=1.5))[0]


def test_the_kernel_s_files_of_the_scope_are_read_back_on_v2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from labkit.workshop import limits

    monkeypatch.setattr(limits, "CGROUP", tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    scope = "/system.slice/s.scope"
    _group(tmp_path / scope[1:], {"cgroup.controllers": "cpu memory pids", "cpu.max": "150000 100000",
                                  "memory.max": str(2**30), "pids.max": "64"})
    assert scopes._kernel(scope, Limits(1.5, 2**30, 64)) == []
    (tmp_path / scope[1:] / "cgroup.controllers").write_text("memory\n")
    wrong = scopes._kernel(scope, Limits(1.5, 2**30, 64))
    assert any("cpu controller" in w for w in wrong) and any("pids controller" in w for w in wrong)
