"""A learner's home and what root shares, without root: the access plan (exactly the path to the shared
environment opened, the course's answers closed), the learner-side preparation (copy, links, profile through
no link or FIFO), and JupyterHub's security settings in the hub's configuration."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import hubconf, paths

from labkit.cli import workshop as cli
from labkit.core.cliargs import Parser
from labkit.workshop import asuser, homes, hubconfig, readonly

HOME_CODE = ("homes.py", "asuser.py", "spawner.py", "readonly.py")


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder others can pass (pytest's own temporary folders are closed to others)."""
    top = Path(tempfile.mkdtemp(prefix="labkit-access-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_access_opens_exactly_the_way_to_the_environment_and_closes_the_answers(open_tmp: Path) -> None:
    closed = open_tmp / "root"
    (closed / "env" / "bin").mkdir(parents=True)
    (closed / "env" / "bin" / "python").write_text("")
    (closed / "notes.txt").write_text("root's")
    (closed / "cache").mkdir()
    (closed / "private").mkdir(mode=0o700)
    (closed / "link").symlink_to("/etc")
    source = open_tmp / "course-source"
    for folder in ("solutions", "course", "labs", ".git"):
        (source / folder).mkdir(parents=True)
    (source / "course" / "INSTRUCTOR.md").write_text("answers")
    closed.chmod(0o700)
    plan = {c.path: c.mode for c in readonly.plan_access(source, [closed / "env" / "bin" / "python"])}
    assert plan == {closed: 0o701, closed / "notes.txt": 0o640, closed / "cache": 0o750,
                    source / "solutions": 0o750, source / ".git": 0o750, source / "course" / "INSTRUCTOR.md": 0o640}
    source.chmod(0o700)  # answers nobody else reaches stay as they are
    assert set(c.path for c in readonly.plan_access(source, [closed / "env"])) == {closed, closed / "notes.txt",
                                                                                   closed / "cache"}
    source.chmod(0o755)
    closed.chmod(0o755)
    assert readonly.closed_folders([closed / "env" / "bin" / "python"]) == []


def test_the_release_is_published_read_only(open_tmp: Path) -> None:
    into = readonly.publish(paths.ROOT, open_tmp / "release")
    assert (into / "labkit" / "workshop" / "homes.py").is_file() and not (into / "solutions").exists()
    assert not (into / "course" / "INSTRUCTOR.md").exists()
    assert list((into / "labkit").glob("__pycache__/*.pyc"))  # compiled once: learners cannot write there
    for folder, _dirs, files in os.walk(into):
        assert _mode(Path(folder)) == 0o755
        assert all(_mode(Path(folder) / f) in (0o644, 0o755) for f in files)


def _plan(home: Path, release: Path, data: Path | None = None) -> homes.Plan:
    return homes.Plan(str(release), sys.prefix, str(data) if data else None, os.getuid(), os.getgid(),
                      tuple(os.getgroups()), str(home))


def test_a_home_gets_the_course_data_link_and_profile_line_once(tmp_path: Path) -> None:
    release = tmp_path / "release"
    (release / "labs" / "__pycache__").mkdir(parents=True)
    (release / "labs" / "a.py").write_text("print(1)\n")
    (release / "labs" / "run.sh").write_text("#!/bin/sh\n")
    (release / "labs" / "run.sh").chmod(0o755)
    (release / "labs" / "link").symlink_to("/etc/hostname")
    os.mkfifo(release / "labs" / "fifo")
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    data.mkdir()
    (home / ".profile").write_text("# skel\n")
    report = homes.prepare(_plan(home, release, data))
    assert report.course_written and report.notes == []
    course = home / homes.COURSE
    assert sorted(p.name for p in (course / "labs").iterdir()) == ["a.py", "run.sh"]  # no link, FIFO or cache
    assert _mode(course / "labs" / "run.sh") == 0o755 and _mode(course / "labs" / "a.py") == 0o644
    assert os.readlink(course / ".venv") == sys.prefix and os.readlink(home / homes.KERAS_DATA) == str(data)
    (course / "labs" / "a.py").write_text("mine\n")
    again = homes.prepare(_plan(home, release, data))
    assert not again.course_written and (course / "labs" / "a.py").read_text() == "mine\n"  # work kept
    text = (home / ".profile").read_text()
    assert text.startswith("# skel\n") and text.count(homes.PROFILE_MARK) == 1
    assert f'export PATH="{Path(sys.prefix) / "bin"}:$PATH"' in text
    assert [p.name for p in home.iterdir() if p.name.startswith(".course-")] == []


def test_the_profile_is_never_written_through_a_link_or_a_fifo(tmp_path: Path) -> None:
    target = tmp_path / "someone-elses"
    target.write_text("keep\n")
    (tmp_path / "link").symlink_to(target)
    assert "left alone" in homes.add_to_profile(tmp_path / "link", sys.prefix)
    assert target.read_text() == "keep\n"
    os.mkfifo(tmp_path / "fifo")
    start = time.monotonic()
    assert "not a regular file" in homes.add_to_profile(tmp_path / "fifo", sys.prefix)
    assert time.monotonic() - start < 1 and stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode)


def test_a_course_that_is_not_a_folder_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "release").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / homes.COURSE).symlink_to(tmp_path / "elsewhere")
    report = homes.prepare(_plan(tmp_path / "home", tmp_path / "release"))
    assert not report.course_written and "not a folder" in report.notes[0]
    assert not (tmp_path / "elsewhere").exists()


def test_the_child_refuses_ids_it_does_not_hold() -> None:
    with pytest.raises(asuser.StillPrivileged, match="as root"):
        asuser.verify_dropped(0, 0, ())
    with pytest.raises(asuser.StillPrivileged):
        asuser.verify_dropped(os.getuid() + 1, os.getgid(), tuple(os.getgroups()))
    with pytest.raises(ValueError, match="never runs as root"):
        asuser.run(asuser.Learner("root", 0, 0, (0,), Path("/root")), ["-c", "pass"], 1)


def test_no_code_that_runs_as_root_changes_an_owner_in_a_home() -> None:
    for name in HOME_CODE:
        assert "chown" not in (paths.ROOT / "labkit" / "workshop" / name).read_text(), name


def _settings(tmp_path: Path, **kw: object) -> hubconfig.HubSettings:
    return hubconf.settings(tmp_path, **{"learners": ["learner01"], **kw})


_load = hubconf.load


def test_the_hub_follows_jupyterhubs_security_model(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    c = _load(hubconfig.config_text(s))
    assert c.Spawner.disable_user_config is True
    assert "--KernelManager.transport=ipc" in c.Spawner.args
    assert f"--LabApp.app_settings_dir={tmp_path / 'release' / 'jupyter' / 'lab-settings'}" in c.Spawner.args
    assert c.WorkshopSpawner.release_dir == str(tmp_path / "release")
    assert c.JupyterHub.services[0]["environment"]["PYTHONPATH"] == str(tmp_path / "release")
    assert "subdomain_host" not in c.JupyterHub and hubconfig.risks(s) == [hubconfig.SHARED_ORIGIN]
    wild = _settings(tmp_path, subdomain_host="https://hub.example.org")
    assert _load(hubconfig.config_text(wild)).JupyterHub.subdomain_host == "https://hub.example.org"
    assert hubconfig.risks(wild) == []
    for bad in ("hub.example.org", "https://hub", "https://x.org/'\nimport os", "ftp://hub.example.org"):
        with pytest.raises(ValueError, match="subdomain host"):
            hubconfig.config_text(_settings(tmp_path, subdomain_host=bad))


def test_the_command_line_takes_a_subdomain_host(capsys: pytest.CaptureFixture[str]) -> None:
    p = Parser(prog="labkit")
    cli.add_parser(p.add_subparsers(dest="subcommand", required=True))
    up = ["workshop", "up", "--learners", "2"]
    assert p.parse_args(up).subdomain_host is None
    assert p.parse_args([*up, "--subdomain-host", "https://hub.example.org"]).subdomain_host == "https://hub.example.org"
    with pytest.raises(SystemExit):
        p.parse_args([*up, "--subdomain-host", "hub.example.org"])
    assert "wildcard DNS name" in capsys.readouterr().err


def test_a_mode_is_set_on_the_path_itself_never_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("canary")
    target.chmod(0o644)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OSError):
        readonly.set_mode(link, 0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o644)
    assert readonly.set_mode(fifo, 0o600) == 0o644 and stat.S_IMODE(fifo.lstat().st_mode) == 0o600  # no hang
    assert readonly.set_mode(target, 0o640) == 0o644 and stat.S_IMODE(target.stat().st_mode) == 0o640
