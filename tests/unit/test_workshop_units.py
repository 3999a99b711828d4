"""The workshop's parts that run without root or a hub: the class records and view, grade results read back,
the hub's configuration text, the account and password commands, and the command line."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import aio, hubconf, paths

from labkit.check.report import Report, StepResult
from labkit.cli import classes as classes_cli
from labkit.cli import workshop as cli
from labkit.core import contract
from labkit.core.cliargs import Parser
from labkit.grading import reports
from labkit.grading.grade import Case, Result
from labkit.records import classlog
from labkit.workshop import (
    accounts,
    classpage,
    classview,
    hubconfig,
    leftovers,
    limits,
    passwords,
    results,
    slurmlimits,
)
from labkit.workshop.state import State

ROOT = paths.ROOT
FIXTURES = paths.FIXTURES / "classview"


def fixture_view() -> classview.View:
    return classview.build(classlog.read(FIXTURES, by_owner=False).records, ["learner03"])


def test_class_records_are_read_skipping_bad_lines() -> None:
    reading = classlog.read(FIXTURES, by_owner=False)  # a copy: each file's records are its name's
    rows = reading.records
    assert len(rows) == 10  # two malformed lines of learner02.jsonl are skipped, and named
    assert [r.time for r in rows] == sorted(r.time for r in rows)
    assert {r.learner for r in rows} == {"learner01", "learner02"}
    assert len(reading.problems) == 2 and all("learner02.jsonl line" in p for p in reading.problems)


@pytest.mark.parametrize(("line", "why"), [
    ('{"learner": "learner02", "lab": "horovod", "step": 1, "passed": true, "message": "", "time": 1.0}',
     "names another learner"),
    ('{"lab": "horovod", "step": true, "passed": true, "message": "", "time": 1.0}', "step is not"),
    ('{"lab": "horovod", "step": 1, "passed": "yes", "message": "", "time": 1.0}', "passed is not"),
    ('{"lab": "../../x", "step": 1, "passed": true, "message": "", "time": 1.0}', "lab is not"),
    ('{"lab": "horovod", "step": 1, "passed": true, "message": 5, "time": 1.0}', "message is not"),
    ('{"lab": "horovod", "step": 1, "passed": true, "message": "", "time": NaN}', "time is not"),
    ('{"lab": "horovod", "step": 1, "passed": true}', "missing message, time"),
    ('[1, 2]', "not a JSON object"),
])
def test_a_bad_record_is_named_and_skipped(tmp_path: Path, line: str, why: str) -> None:
    good = '{"learner": "learner01", "lab": "horovod", "step": 2, "passed": false, "message": "m", "time": 2.0}'
    (tmp_path / "learner01.jsonl").write_text(line + "\n" + good + "\n")
    reading = classlog.read(tmp_path, by_owner=False)
    assert [(r.learner, r.step) for r in reading.records] == [("learner01", 2)]
    assert len(reading.problems) == 1 and "learner01.jsonl line 1" in reading.problems[0] and why in reading.problems[0]
    view = classview.build(reading.records, ["learner01"], reading.problems)
    assert why in view.text() and "Skipped records" in classpage.html_page(view)


def test_class_files_are_capped_and_never_followed(tmp_path: Path) -> None:
    good = '{"lab": "horovod", "step": 1, "passed": true, "message": "", "time": 1.0}\n'
    (tmp_path / "big.jsonl").write_text(good * 100)
    got = classlog.read_file(tmp_path / "big.jsonl", "big", limit=len(good) * 10 + 5)
    assert len(got.records) == 10 and "only its first" in got.problems[0]
    (tmp_path / "target").write_text(good)
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "target")
    os.mkfifo(tmp_path / "fifo.jsonl")
    got = classlog.read(tmp_path, by_owner=False)
    assert {r.learner for r in got.records} == {"big"}
    assert any("link.jsonl: a symbolic link, not read" in p for p in got.problems)
    assert any("fifo.jsonl: not a regular file" in p for p in got.problems)


def test_the_writer_stops_at_the_cap_and_never_follows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(classlog, "MAX_BYTES", 1000)
    rec = classlog.make_record("ann", "horovod", 1, True, "ok", 1.0)
    written = 0
    with pytest.raises(ValueError, match="all the class view reads"):
        for _ in range(100):
            classlog.write([rec], tmp_path)
            written += 1
    path = tmp_path / f"ann{classlog.SUFFIX}"
    assert 0 < written < 100 and path.stat().st_size <= 1000
    assert len(classlog.read_file(path, "ann").records) == written  # what was written stays whole
    (tmp_path / "target").write_text("")
    (tmp_path / f"bob{classlog.SUFFIX}").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        classlog.write([classlog.make_record("bob", "horovod", 1, True, "ok", 1.0)], tmp_path)
    assert (tmp_path / "target").read_text() == ""


def test_class_view_grid_rates_failures_and_minutes() -> None:
    view = fixture_view()
    assert view.learners == ["learner01", "learner02", "learner03"]
    assert [c.key for c in view.columns] == ["horovod/1", "horovod/2", "horovod/3"]
    assert view.columns[0].title.startswith("initialise Horovod")
    one, two, three = view.columns
    cell = view.cell("learner01", one)
    assert cell is not None and cell.passed and cell.attempts == 3
    assert view.cell("learner02", two).passed is False and view.cell("learner03", one) is None
    assert (one.pass_rate, two.pass_rate, three.pass_rate) == (pytest.approx(2 / 3), pytest.approx(1 / 3), 0.0)
    assert (one.passed, one.tried, two.tried) == (2, 2, 2)
    assert one.failures == [("hvd.init() was not called: no rank knew its Horovod rank", 2)]  # learners, not tries
    assert two.failures[0][1] == 2 and three.failures[0][1] == 1
    assert one.minutes == pytest.approx(6.5)  # learner01: 0 -> 5 min, learner02: 1 -> 9 min
    assert two.minutes == pytest.approx(7.0) and three.minutes is None
    assert [view.stuck_at(w) and view.stuck_at(w).key for w in view.learners] == ["horovod/3", "horovod/2", None]


def test_class_view_text_json_and_html() -> None:
    view = fixture_view()
    text = view.text()
    assert "learner03" in text and "FAIL x1" in text and "67%" in text and "median 6.5 min" in text
    data = json.loads(json.dumps(view.to_dict()))
    assert data["stuck_at"] == {"learner01": "horovod/3", "learner02": "horovod/2", "learner03": None}
    assert data["steps"][0]["common_failures"][0]["learners"] == 2
    page = classpage.html_page(view, refresh=10)
    assert page.startswith("<!DOCTYPE html>") and "http-equiv='refresh' content='10'" in page
    assert page.count("<tr>") == 1 + 3 + 2  # head, learners, pass rate and minutes
    assert "stuck at horovod/3" in page and "<script" not in page and "http" not in page.replace("http-equiv", "")
    evil = classview.build([classlog.make_record("<b>x</b>", "horovod", 1, False, "<script>alert(1)</script>", 1.0)])
    assert "<script>alert" not in classpage.html_page(evil) and "&lt;b&gt;x&lt;/b&gt;" in classpage.html_page(evil)
    assert classview.build([]).text().startswith("class view: no check")


def test_check_report_is_recorded_in_the_class_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = Report("horovod", "fashion_mnist.py", [StepResult(1, True, "ok"), StepResult(2, False, "x" * 2000)])
    monkeypatch.delenv(contract.CLASS_DIR, raising=False)
    assert classlog.record_check(report) is None and list(tmp_path.iterdir()) == []  # outside a workshop: nothing
    monkeypatch.setenv(contract.CLASS_DIR, str(tmp_path))
    assert classlog.record_check(report) is None
    verdict = SimpleNamespace(passed=True, message="reached 83% after 70 s")
    assert classlog.record_assessment(verdict) is None
    rows = classlog.read(tmp_path).records  # the file's owner (this user) is the learner
    me = classlog.learner_name()
    assert [(r.learner, r.lab, r.step, r.passed) for r in rows] == [
        (me, "horovod", 1, True), (me, "horovod", 2, False), (me, "assessment", 1, True)]
    assert len(rows[1].message) == classlog.MESSAGE_LIMIT
    monkeypatch.setenv(contract.CLASS_DIR, str(tmp_path / "missing"))
    assert "not written" in classlog.record_check(report)  # said, not raised


def _graded(passed_steps: int) -> Result:
    cases = [Case("horovod", k, f"title {k}", k <= passed_steps, "" if k <= passed_steps else f"step {k} fails\nmore",
                  1.0 if k <= passed_steps else 0.0, 1.0, 2.0) for k in range(1, 4)]
    return Result("labs", cases, 6.0)


def test_grade_results_are_read_from_json_classroom_and_junit(tmp_path: Path) -> None:
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "grade.json").write_text(json.dumps(_graded(3).to_dict()))
    (tmp_path / "alice" / "grade.xml").write_text(reports.junit_xml(_graded(3)))  # the same result twice
    (tmp_path / "bob.xml").write_text(reports.junit_xml(_graded(1)))
    classroom = {"version": 1, "status": "fail", "max_score": 3.0, "tests": [  # as labkit wrote it for GitHub Classroom
        {"name": c.name, "status": "pass" if c.passed else "fail", "score": c.points, "max_score": c.max_points,
         "message": c.message} for c in _graded(2).cases]}
    (tmp_path / "carol.json").write_text(json.dumps(classroom))
    (tmp_path / "notes.json").write_text("{}")
    rows, problems = results.read_folder(tmp_path)
    assert problems == [f"{tmp_path / 'notes.json'}: no labkit grade result in it"]
    view = classview.build(rows)
    assert view.learners == ["alice", "bob", "carol"]
    assert [c.passed for c in view.columns] == [3, 2, 1]
    assert view.cell("alice", view.columns[0]).attempts == 1
    assert view.cell("bob", view.columns[1]).message.startswith("step 2 fails")
    assert view.columns[2].failures == [("step 3 fails", 2)] and view.columns[0].minutes is None


_settings = hubconf.settings
_load = hubconf.load


def test_hub_config_own_login_mode(tmp_path: Path) -> None:
    c = _load(hubconfig.config_text(_settings(tmp_path, cores=1.5, memory=2 * 2**30, pids=512,
                                              extra_env={"SLURM_CONF": "/x"})))
    assert c.JupyterHub.bind_url == "http://127.0.0.1:8123" and c.JupyterHub.hub_port == 8124
    assert c.JupyterHub.authenticator_class == "labkit.workshop.hubauth.WorkshopAuthenticator"
    assert c.WorkshopAuthenticator.password_file == str(tmp_path / "logins")
    terminal = [a for a in c.Spawner.args if a.startswith("--ServerApp.terminado_settings=")]
    assert [json.loads(a.split("=", 1)[1]) for a in terminal] == [{"shell_command": hubconfig.TERMINAL}]
    assert c.Authenticator.allowed_users == {"learner01", "learner02"} and c.Authenticator.admin_users == {"instructor"}
    assert c.JupyterHub.spawner_class == "labkit.workshop.spawner.WorkshopSpawner"
    assert c.WorkshopSpawner.release_dir == str(tmp_path / "release")
    assert c.WorkshopSpawner.class_dir == str(tmp_path / "class")
    assert (c.Spawner.cpu_limit, c.Spawner.mem_limit, c.WorkshopSpawner.pids_limit) == (1.5, 2 * 2**30, 512)
    assert c.Spawner.environment == {"SLURM_CONF": "/x"}
    assert c.JupyterHub.db_url == f"sqlite:///{tmp_path}/jupyterhub.sqlite"
    service = c.JupyterHub.services[0]
    assert service["name"] == "class" and service["user"] == "instructor" and service["url"].endswith(":8126")
    assert service["command"][-1] == "labkit.workshop.service"
    assert service["environment"][contract.CLASS_DIR] == str(tmp_path / "class")
    assert "password" not in hubconfig.config_text(_settings(tmp_path)).lower().replace("password_file", "")


def test_hub_config_shared_password_mode(tmp_path: Path) -> None:
    text = hubconfig.config_text(_settings(tmp_path, auth="shared", user_password="abcdefgh", admin_password="a" * 32))
    c = _load(text)
    assert c.JupyterHub.authenticator_class == "labkit.workshop.hubauth.SharedAuthenticator"
    assert c.SharedPasswordAuthenticator.user_password == "abcdefgh"
    with pytest.raises(ValueError, match="8\\+ characters"):
        hubconfig.config_text(_settings(tmp_path, auth="shared", user_password="short", admin_password="a" * 32))
    with pytest.raises(ValueError, match="hub or shared"):
        hubconfig.config_text(_settings(tmp_path, auth="oauth"))
    path = hubconfig.write(_settings(tmp_path), tmp_path / "jupyterhub_config.py")
    assert path.stat().st_mode & 0o777 == 0o600


def test_account_commands_are_built_without_running() -> None:
    assert accounts.learner_names(3) == ["learner01", "learner02", "learner03"]
    assert accounts.learner_names(100)[0] == "learner001"
    for bad in (0, 1000, "3"):
        with pytest.raises(ValueError):
            accounts.learner_names(bad)  # type: ignore[arg-type]
    acc = accounts.Accounts(["learner01"], home_root=Path("/srv/homes"))
    up = accounts.plan_up(acc)
    assert [s[:2] for s in up] == [("group", accounts.LEARNER_GROUP), ("group", accounts.INSTRUCTOR_GROUP),
                                   ("user", "learner01"), ("user", "instructor")]
    assert up[2][2][:5] == ["useradd", "--create-home", "--home-dir", "/srv/homes/learner01", "--shell"]
    assert up[3][2][up[3][2].index("--groups") + 1] == accounts.INSTRUCTOR_GROUP
    for _, _, argv in up[2:]:  # no password opens the account, no shell lets it log in (ssh, su)
        assert argv[argv.index("--password") + 1] == "!" and argv[argv.index("--shell") + 1].endswith("/nologin")
    down = accounts.plan_down({"users": ["learner01", "instructor"], "groups": ["g1", "g2"]})
    assert [s[2] for s in down] == [["userdel", "--remove", "learner01"], ["userdel", "--remove", "instructor"],
                                    ["groupdel", "g2"], ["groupdel", "g1"]]
    assert accounts.taken(accounts.Accounts(["root"], instructor="nobody-here-x")) [:1] == ["user root"]
    assert accounts.plan_down({}) == [] and leftovers.temp_files({-5}) == []


def test_cron_and_at_jobs_of_the_users_are_found(tmp_path: Path) -> None:
    crontabs, atjobs = tmp_path / "crontabs", tmp_path / "atjobs"
    crontabs.mkdir()
    atjobs.mkdir()
    (crontabs / "learner01").write_text("* * * * * true\n")
    (atjobs / "a0001").write_text("true\n")
    (atjobs / "link").symlink_to(crontabs / "learner01")
    me = os.getuid()
    assert sorted(p.name for p in leftovers.scheduled_jobs({me}, [crontabs, atjobs, tmp_path / "none"])) == [
        "a0001", "learner01"]
    assert leftovers.scheduled_jobs({me + 12345}, [crontabs, atjobs]) == []


def test_passwords_are_kept_only_as_salted_scrypt_hashes(tmp_path: Path) -> None:
    pw = {"learner01": passwords.generate(), "instructor": passwords.generate(32)}
    assert len(pw["learner01"]) == 12 and set(pw["instructor"]) <= set(passwords.ALPHABET)
    logins = tmp_path / "logins"
    passwords.save_hashes(pw, logins)
    text = logins.read_text()
    assert logins.stat().st_mode & 0o777 == 0o600 and not any(secret in text for secret in pw.values())
    hashes = passwords.load_hashes(logins)
    assert all(h.startswith("scrypt$16384$8$1$") for h in hashes.values())
    assert passwords.hash_password("same") != passwords.hash_password("same")  # salted
    assert passwords.check(logins, "learner01", pw["learner01"])
    assert passwords.check(logins, "instructor", pw["instructor"])
    assert not passwords.check(logins, "learner01", pw["instructor"]) and not passwords.check(logins, "nobody", "x")
    assert not passwords.check(logins, "learner01", pw["learner01"] + "x")
    for broken in ("", "scrypt$1$1$1$x$y", "scrypt$16384$8$1$%%%$abc", "md5$x"):
        assert passwords.verify("x", broken) is False
    passwords.replace("learner01", "new-one", logins)
    assert passwords.check(logins, "learner01", "new-one") and not passwords.check(logins, "learner01", pw["learner01"])
    assert passwords.check(logins, "instructor", pw["instructor"])
    with pytest.raises(KeyError):
        passwords.replace("learner09", "x", logins)


def test_the_hubs_login_checks_the_hashes(tmp_path: Path) -> None:
    pytest.importorskip("jupyterhub")
    from labkit.workshop import hubauth

    passwords.save_hashes({"learner01": "right-one"}, tmp_path / "logins")
    auth = hubauth.WorkshopAuthenticator(password_file=str(tmp_path / "logins"))

    def login(name: str, password: str) -> object:
        return aio.run(auth.authenticate(None, {"username": name, "password": password}))

    assert login("learner01", "right-one") == "learner01"
    assert login("learner01", "wrong") is None and login("learner02", "right-one") is None
    assert login("learner01", "") is None and login("learner01", "x" * 10_000) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--ip", "0.0.0.0'; import os; os.system('x') #"], "not an IP address"),
    (["--ip", "localhost"], "not an IP address"),
    (["--cores", "inf"], "above 0"), (["--cores", "nan"], "above 0"), (["--cores", "0"], "above 0"),
    (["--cores", "-2"], "above 0"), (["--cores", "two"], "above 0"),
    (["--memory", "0G"], "at least 64M"), (["--memory", "lots"], "a number with K, M, G or T"),
    (["--memory=-1G"], "a number with K, M, G or T"), (["--pids", "3"], "from 16 up"),
])
def test_up_refuses_bad_values_before_anything(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["workshop", "up", "--learners", "2", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_slurm_jobs_get_the_partitions_time_and_memory_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []

    def scontrol(conf: Path, *args: str) -> str:
        calls.append(args)
        return ("PartitionName=nodes AllowGroups=ALL Default=YES MaxTime=UNLIMITED MaxMemPerNode=UNLIMITED "
                "Nodes=node[1-2]\n")

    monkeypatch.setattr(slurmlimits, "scontrol", scontrol)
    assert slurmlimits.current(Path("/x")) == {"MaxTime": "UNLIMITED", "DefMemPerNode": "UNLIMITED",
                                               "MaxMemPerNode": "UNLIMITED"}
    slurmlimits.apply(Path("/x"), slurmlimits.for_jobs(30, None))
    assert calls[-1] == ("update", "PartitionName=nodes", "MaxTime=30")
    slurmlimits.apply(Path("/x"), slurmlimits.for_jobs(5, 3 * 2**30))
    assert calls[-1] == ("update", "PartitionName=nodes", "MaxTime=5", "DefMemPerNode=3072", "MaxMemPerNode=3072")
    for bad in ({"MaxTime": "30 Nodes=evil"}, {"MaxMemPerNode": "1G"}, {"AllowGroups": "ALL"}):
        with pytest.raises(slurmlimits.SlurmLimitError):
            slurmlimits.apply(Path("/x"), bad)
    assert len(calls) == 5  # nothing was sent for the bad values


def test_a_new_password_for_one_learner(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    st = State(tmp_path, ["learner01"])
    st.private.mkdir()
    st.save()
    passwords.save_hashes({"learner01": "old-one", "instructor": "x" * 32}, st.logins)
    monkeypatch.setenv(contract.WORKSHOP_STATE, str(tmp_path))
    assert cli.run(_parser().parse_args(["workshop", "password", "learner01"])) == 0
    name, secret = capsys.readouterr().out.split()
    assert name == "learner01" and passwords.check(st.logins, "learner01", secret)
    assert not passwords.check(st.logins, "learner01", "old-one") and passwords.check(st.logins, "instructor", "x" * 32)
    assert cli.run(_parser().parse_args(["workshop", "password", "learner09"])) == 2


def test_limits_and_addresses_are_checked() -> None:
    assert limits.parse_memory("4G") == 4 * 2**30 and limits.parse_memory("1.5G") == int(1.5 * 2**30)
    assert limits.parse_memory("512M") == 512 * 2**20 and limits.parse_memory("2GiB") == 2 * 2**30
    for bad in ("0G", "", "4", "G", "1e9G", "4X", "10K"):
        with pytest.raises(limits.LimitError):
            limits.parse_memory(bad)
    for bad in (float("inf"), float("nan"), 0, -1.0, 1e9, True):
        with pytest.raises(limits.LimitError):
            limits.check_cores(bad)  # type: ignore[arg-type]
    assert limits.check_cores(1.5) == 1.5 and limits.check_pids(64) == 64
    assert hubconfig.check_ip("::1") == "::1" and hubconfig.check_ip("0.0.0.0") == "0.0.0.0"
    for bad in ("", "127.0.0.1:80", "1.2.3.4'\nimport os", "hub.example.org"):
        with pytest.raises(ValueError, match="not an IP address"):
            hubconfig.check_ip(bad)
    for kw in ({"ip": "1.2.3"}, {"cores": float("inf")}, {"memory": 0}, {"memory": "2G"}, {"port": 0},
               {"logins": None}):
        with pytest.raises(ValueError):
            _settings(Path("/x"), **kw).check()
    assert limits.Limits(1.5, 2**30, 64).describe() == "1.5 cores, 1 GiB, 64 tasks"
    assert limits.Limits().asked() == [] and limits.probe(limits.Limits()) is None


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="labkit")
    sub = p.add_subparsers(dest="subcommand", required=True)
    cli.add_parser(sub)
    classes_cli.add_cli(sub)
    return p


def run_class(argv: list[str]) -> int:
    """``labkit class ...`` as the command line runs it (the parser's ``func``)."""
    args = _parser().parse_args(argv)
    return args.func(args)


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    a = _parser().parse_args(["workshop", "up", "--port", "8001", "--learners", "3", "--slurm"])
    assert (a.action, a.learners, a.port, a.slurm, a.func) == ("up", 3, 8001, True, cli.run)
    for bad in (["workshop", "up"], ["workshop", "up", "--learners", "0"], ["class", "status", "--bogus"]):
        with pytest.raises(SystemExit) as e:
            _parser().parse_args(bad)
        assert e.value.code == 2
    monkeypatch.setenv(contract.WORKSHOP_STATE, str(tmp_path / "none"))
    assert run_class(["class", "status"]) == 2
    assert "no workshop is up" in capsys.readouterr().err
    assert cli.run(_parser().parse_args(["workshop", "status", "--json"])) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "down"
    assert cli.run(_parser().parse_args(["workshop", "down"])) == 0 and "nothing was up" in capsys.readouterr().out
    out = tmp_path / "view.html"
    assert run_class(["class", "status", "--from", str(tmp_path / "nope")]) == 2
    shutil.copytree(FIXTURES, tmp_path / "records")
    assert run_class(["class", "status", "--json", "--html", str(out), "--from",
                                         str(tmp_path / "records")]) == 0
    assert "stuck at horovod/3" in out.read_text()  # a copy of a class folder reads as records
    said = capsys.readouterr()
    shown = json.loads(said.out)
    assert len(shown.pop("skipped")) == 2 and "learner02.jsonl line 5" in said.err  # named
    expected = json.loads(json.dumps(fixture_view().to_dict()))
    assert shown == {k: v for k, v in expected.items() if k != "skipped"}  # the same view as from the class folder


def test_up_and_down_refuse_without_root(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.WORKSHOP_STATE, str(tmp_path / "state"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.run(_parser().parse_args(["workshop", "up", "--learners", "2"])) == 1
    assert "a workshop needs root" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "state.json").write_text("{}")
    assert cli.run(_parser().parse_args(["workshop", "down"])) == 1
    assert "needs root" in capsys.readouterr().err and (tmp_path / "state" / "state.json").exists()
