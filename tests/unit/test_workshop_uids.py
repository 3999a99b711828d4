"""User ids a workshop hands out (never one handed out before, none in use, within UID_MAX), the record of them
beside the state folder, and what ``down`` reads of a learner's IPC objects and leftovers: without accounts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labkit.workshop import accounts, leftovers, state


def test_uids_are_fresh_free_and_within_the_range() -> None:
    names = ["learner01", "learner02", "instructor"]
    assert accounts.fresh_uids(names, 0, set(), 1000, 60000) == {"learner01": 1000, "learner02": 1001,
                                                                  "instructor": 1002}
    got = accounts.fresh_uids(names, 1500, {1501, 1503}, 1000, 60000)
    assert got == {"learner01": 1502, "learner02": 1504, "instructor": 1505}
    with pytest.raises(accounts.AccountsError, match="UID_MAX 1503"):
        accounts.fresh_uids(names, 1500, {1502}, 1000, 1503)
    plan = accounts.plan_up(accounts.Accounts(["learner01"]), {"learner01": 2001, "instructor": 2002})
    users = {name: argv for kind, name, argv in plan if kind == "user"}
    assert users["learner01"][users["learner01"].index("--uid") + 1] == "2001"
    assert users["instructor"][users["instructor"].index("--uid") + 1] == "2002"
    assert all("--uid" not in argv for _, _, argv in accounts.plan_up(accounts.Accounts(["learner01"])))


def test_the_system_uid_range_is_read_from_login_defs(tmp_path: Path) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("# UID_MIN 5\nUID_MIN\t\t 2000\nUID_MAX 3000\nSYS_UID_MAX 999\n")
    assert accounts.uid_range(defs) == (2000, 3000)
    assert accounts.uid_range(tmp_path / "none") == accounts.UIDS


def test_the_uid_record_sits_beside_the_state_folder_and_only_grows(tmp_path: Path) -> None:
    assert state.uid_record("/var/lib/labkit-workshop") == Path("/var/lib/labkit-workshop-uids")
    assert state.State(tmp_path / "st").uid_file == tmp_path / "labkit-workshop-uids"
    record = tmp_path / "labkit-workshop-uids"
    assert state.last_uid(record) == 0
    if os.geteuid() != 0:
        pytest.skip("the record is root's: written and trusted only as root")
    state.note_uid(record, 1005)
    state.note_uid(record, 1002)  # lower: the record keeps the highest
    assert state.last_uid(record) == 1005 and record.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [record.name]
    record.chmod(0o666)  # anyone could have written it: not trusted
    with pytest.raises(OSError, match="only root writes"):
        state.last_uid(record)
    record.unlink()
    record.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        state.last_uid(record)
    record.unlink()
    record.write_text("lots\n")
    with pytest.raises(OSError, match="not a uid"):
        state.last_uid(record)


def test_sysv_ipc_objects_are_read_by_their_header(tmp_path: Path) -> None:
    (tmp_path / "shm").write_text(
        "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime\n"
        "         0         12   600                 65536   100   100      0  1005  1005  1005  1005          0\n"
        "         0         13   600                  4096   100   100      0     0     0     0     0          0\n"
        "         0         14   600                  4096   100   100      0     0     0  1005  1005          0\n")
    (tmp_path / "sem").write_text(
        "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n"
        "         0          4   600          2  1006  1006  1006  1006          0          0\n")
    (tmp_path / "msg").write_text("garbage\n")
    assert leftovers.ipc_objects({1005, 1006}, tmp_path) == [("shm", 12, 1005), ("shm", 14, 1005), ("sem", 4, 1006)]
    assert leftovers.ipc_objects({0}, tmp_path / "none") == []
    leftovers.remove_ipc("shm", 2**31 - 1)  # gone already: nothing to do
    with pytest.raises(ValueError):
        leftovers.remove_ipc("pipe", 1)


def test_leftovers_are_found_in_sticky_folders_of_root_too(tmp_path: Path) -> None:
    places = leftovers.places()
    assert len({os.path.realpath(p) for p in places}) == len(places)  # /var/lock as a link to /run/lock: once
    if os.geteuid() != 0:
        pytest.skip("files of another uid: made as root")
    learner = 54323
    (tmp_path / "mine").write_text("x")
    sticky = tmp_path / ".X11-unix"  # root's, everyone writes, sticky
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "X7").write_text("x")
    (tmp_path / "roots").write_text("x")
    for path in (tmp_path / "mine", sticky / "X7"):
        os.chown(path, learner, learner)
    found = sorted(str(p.relative_to(tmp_path)) for p in leftovers.temp_files({learner}, [tmp_path]))
    assert found == [".X11-unix/X7", "mine"]
