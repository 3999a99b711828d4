"""A workshop's accounts, class records, limits and state under a hostile learner, without a hub.

One workshop for the module (``lifecycle.up`` for two learners, the hub replaced by a canary ``sleep``: what is
tested here needs no hub), then, as a learner would: log in with the printed password by ``su`` (through PAM,
from a terminal) and by ``ssh`` (a loopback sshd with password login on), forge and break class records, plant a
symlink, a FIFO and an oversized class file, run a fork bomb under ``pids.max`` and a memory hog under the memory
limit in the learner's own control group, leave a process and a crontab behind; then a reused pid in the state
and ``down`` with stale pids. Targets are canaries. Nothing is left behind (users, groups, homes, processes,
control groups, files). Needs root, useradd and Linux control groups; skipped otherwise.
"""

from __future__ import annotations

import grp
import json
import os
import pty
import pwd
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.learner import BOMB, HOG, PYTHON, becomes, run_as, without_hub

from labkit.records import classlog
from labkit.workshop import accounts, asuser, hub, leftovers, lifecycle, limits, passwords, started
from labkit.workshop.started import Started

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                 reason="needs root and useradd (Unix accounts for the learners)"),
              pytest.mark.slow]  # accounts made and removed, logins through PAM and sshd

PIDS = 64  # tasks per learner in this module's workshop
DISK = "300M"  # each home's disk
MEMORY = "128M"


def _snapshot() -> dict[str, object]:
    return {"users": {p.pw_name for p in pwd.getpwall()}, "groups": {g.gr_name for g in grp.getgrall()},
            "homes": set(os.listdir("/home")), "root_mode": os.stat("/root").st_mode}


def _canary(seconds: int = 600) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", str(seconds)], stdin=subprocess.DEVNULL, start_new_session=True)


class Workshop:
    def __init__(self, st: lifecycle.State, pw: dict[str, str], fake_hub: subprocess.Popen[bytes],
                 spools: list[Path]) -> None:
        self.st, self.pw, self.fake_hub, self.spools = st, pw, fake_hub, spools


@pytest.fixture(scope="module")
def workshop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workshop]:
    if lifecycle.State.load() is not None or accounts.user_exists("learner01"):
        pytest.skip("a workshop is up on this machine already")
    if limits.probe(limits.Limits(None, limits.parse_memory(MEMORY), PIDS)) is not None:
        pytest.skip(f"control groups cannot hold limits here: {limits.probe(limits.Limits(None, None, PIDS))}")
    state = Path(f"/run/labkit-workshop-hostile-{os.getpid()}")
    spools = [tmp_path_factory.mktemp("crontabs"), tmp_path_factory.mktemp("atjobs")]
    for spool in spools:
        spool.chmod(0o1733)  # as cron's: learners may add their own file
    before = _snapshot()
    fake_hub = _canary()
    uids: set[int] = set()
    with pytest.MonkeyPatch.context() as mp:
        without_hub(mp, fake_hub.pid)
        mp.setattr(accounts, "JOB_SPOOLS", tuple(spools))
        try:
            st, pw = lifecycle.up(lifecycle.Plan(2, port=1, folder=str(state), memory=MEMORY, pids=PIDS, disk=DISK),
                                  say=print)
            uids = accounts.uids_of(st.made["users"])
            yield Workshop(st, pw, fake_hub, spools)
        finally:
            lifecycle.down(str(state))
            assert lifecycle.down(str(state)) == []
            if fake_hub.poll() is None:
                fake_hub.kill()
            fake_hub.wait()
            assert _snapshot() == before and not state.exists()
            assert len(uids) == 3 and leftovers.processes_of(uids) == [] and leftovers.temp_files(uids) == []
            assert leftovers.scheduled_jobs(uids, spools) == []
            assert [b for b in limits.bases().values() if b.exists()] == []


def _user(name: str) -> pwd.struct_passwd:
    return pwd.getpwnam(name)


def _shadow(name: str) -> str:
    for line in Path("/etc/shadow").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return fields[1]
    raise KeyError(name)


# --- hub logins only -----------------------------------------------------------------------------------------


def test_accounts_have_no_password_and_no_login_shell(workshop: Workshop) -> None:
    st, pw = workshop.st, workshop.pw
    for name in (*st.learners, st.instructor):
        assert _shadow(name).startswith("!"), name  # locked: no password opens it
        assert _user(name).pw_shell.endswith("/nologin"), name
        assert passwords.check(st.logins, name, pw[name])  # the printed password is the hub's
    assert st.logins.stat().st_mode & 0o777 == 0o600 and st.logins.stat().st_uid == 0
    text = st.logins.read_text()
    assert not any(secret in text for secret in pw.values())  # only hashes are kept
    assert not any(p.name == "passwords.txt" for p in st.folder.rglob("*"))


def _su_from_a_terminal(as_user: str, target: str, password: str, timeout: float = 20) -> str:
    """``su TARGET -c 'echo ...'`` run by ``as_user`` in a pseudo-terminal, typing ``password``; what it printed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: become the other learner, then ask su for the target
        try:
            becomes(as_user)()
            os.execve("/usr/bin/su", ["su", target, "-c", "echo SU-GOT-IN"], {"PATH": "/usr/bin:/bin", "LANG": "C"})
        finally:
            os._exit(127)
    out = b""
    typed = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    break
                continue
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if not typed and b"assword" in out:
                os.write(fd, password.encode() + b"\n")
                typed = True
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        os.close(fd)
    return out.decode(errors="replace")


def test_su_with_the_learners_own_password_fails(workshop: Workshop) -> None:
    if not Path("/usr/bin/su").exists():
        pytest.skip("no su here")
    said = _su_from_a_terminal("learner02", "learner01", workshop.pw["learner01"])
    assert "assword" in said and "SU-GOT-IN" not in said, said  # PAM asked, and refused
    assert "failure" in said.lower() or "incorrect" in said.lower(), said


def test_ssh_with_the_learners_own_password_fails(workshop: Workshop, tmp_path: Path) -> None:
    sshd, ssh = shutil.which("sshd", path="/usr/sbin:/sbin"), shutil.which("ssh")
    if sshd is None or ssh is None or shutil.which("ssh-keygen") is None:
        pytest.skip("no OpenSSH server or client here")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "host_key")], check=True,
                   timeout=30)
    port = tfconfig_port()
    (tmp_path / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path / 'host_key'}\nPidFile {tmp_path / 'sshd.pid'}\n"
        "UsePAM yes\nPasswordAuthentication yes\nKbdInteractiveAuthentication yes\nPubkeyAuthentication no\n"
        "PermitRootLogin no\nStrictModes no\n")
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{workshop.pw['learner01']}'\n")
    askpass.chmod(0o700)
    daemon = subprocess.Popen([sshd, "-D", "-e", "-f", str(tmp_path / "sshd_config")], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sshd.log", "wb"),  # noqa: SIM115
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not _answers(port) and time.monotonic() < deadline:
            assert daemon.poll() is None, (tmp_path / "sshd.log").read_text()
            time.sleep(0.1)
        env = {"PATH": "/usr/bin:/bin", "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
               "DISPLAY": ":0", "HOME": str(tmp_path)}
        out = subprocess.run([ssh, "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o",
                              f"UserKnownHostsFile={tmp_path / 'known'}", "-o", "PreferredAuthentications=password",
                              "-o", "NumberOfPasswordPrompts=1", "-o", "ConnectTimeout=10", "learner01@127.0.0.1",
                              "echo SSH-GOT-IN"], env=env, capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(10)
    assert out.returncode != 0 and "SSH-GOT-IN" not in out.stdout, out
    assert "Permission denied" in out.stderr, out.stderr  # the password was tried and refused


def tfconfig_port() -> int:
    from labkit.core import tfconfig

    return tfconfig.free_ports(1)[0]


def _answers(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


# --- class records the instructor can trust ------------------------------------------------------------------


def _record(**kw: object) -> str:
    row = {"learner": "learner01", "lab": "horovod", "step": 1, "passed": True, "message": "", "time": time.time()}
    return json.dumps({**row, **kw})


def _append_as(name: str, path: Path, text: str) -> subprocess.CompletedProcess[str]:
    return run_as(name, [PYTHON, "-c", "import sys; open(sys.argv[1], 'a').write(sys.stdin.read())", str(path)],
                   input=text)


def test_a_forged_and_a_malformed_record_are_named_and_skipped(workshop: Workshop) -> None:
    st = workshop.st
    mine, theirs = st.class_dir / "learner01.jsonl", st.class_dir / "learner02.jsonl"
    lines = [_record(learner="learner02", passed=False, message="forged"), "{not json", _record(step=2)]
    assert _append_as("learner01", mine, "".join(x + "\n" for x in lines)).returncode == 0
    refused = _append_as("learner01", theirs, _record(learner="learner02", message="forged") + "\n")
    assert refused.returncode != 0 and "Permission denied" in refused.stderr  # another learner's file is closed
    reading = classlog.read(st.class_dir, learners=st.learners)
    assert [(r.learner, r.step) for r in reading.records] == [("learner01", 2)]
    assert not any(r.message == "forged" for r in reading.records)
    assert any("learner01.jsonl line 1: names another learner ('learner02')" in p for p in reading.problems)
    assert any("learner01.jsonl line 2:" in p for p in reading.problems)


def test_the_class_view_reads_no_link_no_fifo_and_no_more_than_its_cap(workshop: Workshop, tmp_path: Path) -> None:
    st = workshop.st
    mine = st.class_dir / "learner01.jsonl"
    canary = tmp_path / "canary.jsonl"
    canary.write_text(_record(learner="learner02", message="through a link") + "\n")
    # a class folder whose learner01.jsonl is a link, then a FIFO (the workshop's own is bound to the learner's
    # disk and cannot be replaced; the reader is shown not to trust the folder either way)
    folder = tmp_path / "class"
    folder.mkdir()
    planted = folder / "learner01.jsonl"
    planted.symlink_to(canary)
    os.lchown(planted, _user("learner01").pw_uid, -1)
    reading = classlog.read(folder, learners=st.learners)
    assert not any(r.message == "through a link" for r in reading.records)
    assert any("learner01.jsonl: a symbolic link, not read" in p for p in reading.problems)
    planted.unlink()
    os.mkfifo(planted)
    os.chown(planted, _user("learner01").pw_uid, -1)
    start = time.monotonic()
    reading = classlog.read(folder, learners=st.learners)  # a FIFO with no writer: never waited for
    assert time.monotonic() - start < 5 and any("not a regular file" in p for p in reading.problems)
    refused = run_as("learner01", ["mv", str(mine), str(mine) + ".gone"])  # the folder is not theirs to change
    assert refused.returncode != 0 and mine.is_file()
    big = (_record(message="x" * 500) + "\n") * (classlog.MAX_BYTES // 500 + 2000)  # about 3 MiB
    assert _append_as("learner01", mine, big).returncode == 0
    assert mine.stat().st_size > classlog.MAX_BYTES
    start = time.monotonic()
    reading = classlog.read(st.class_dir, learners=st.learners)
    took = time.monotonic() - start
    assert any("only its first" in p for p in reading.problems)
    assert len(reading.records) * 500 < classlog.MAX_BYTES + 10_000 and took < 10, took
    print(f"\nclass view over a {mine.stat().st_size / 2**20:.1f} MiB file: {took:.2f} s, "
          f"{len(reading.records)} records read")


# --- limits that hold ----------------------------------------------------------------------------------------

def _group_files(name: str) -> tuple[list[str], Path]:
    procs, problem = limits.make(name, limits.Limits(None, limits.parse_memory(MEMORY), PIDS))
    assert problem is None and procs
    folder = Path(next(p for p in procs if "/pids/" in p or "/memory/" not in p)).parent
    return procs, folder


PREPARED = f"""{asuser.NOT_DUMPABLE}
import ctypes, json, os
print(json.dumps({{"cgroup": open("/proc/self/cgroup").read(), "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
                  "ids": [os.getuid(), os.geteuid(), os.getgid()], "nnp": open("/proc/self/status").read()}}))
"""


def test_the_home_s_preparation_runs_in_the_learner_s_limits_and_cannot_be_traced(workshop: Workshop) -> None:
    procs, folder = _group_files("learner01")
    learner = asuser.Learner.of("learner01")
    done = asuser.run(learner, ["-c", PREPARED], timeout=30, groups_files=tuple(procs))
    assert done.code == 0, done.err
    seen = json.loads(done.out)
    assert f"/{limits.FOLDER}/learner01" in seen["cgroup"] and seen["dumpable"] == 0  # in the learner's groups
    assert seen["ids"] == [learner.uid, learner.uid, learner.gid] and "NoNewPrivs:\t1" in seen["nnp"]
    with pytest.raises(ValueError):
        asuser.run(asuser.Learner("root", 0, 0, (0,), Path("/root")), ["-c", "pass"], 5, tuple(procs))


# Appends to the file named until the disk refuses (or 2 GiB); prints how far it got.
FILL = """
import errno, sys
written = 0
with open(sys.argv[1], "ab") as f:
    try:
        while written < 2 * 2**30:
            f.write(b"[" * 2**20)
            f.flush()
            written += 2**20
    except OSError as e:
        print("stopped", errno.errorcode[e.errno], written // 2**20)
"""


def test_a_learner_fills_only_their_own_disk(workshop: Workshop) -> None:
    home = Path(pwd.getpwnam("learner01").pw_dir)
    free = shutil.disk_usage("/").free
    out = run_as("learner01", [PYTHON, "-c", FILL, str(home / "fill")], timeout=120)
    try:
        said = out.stdout.split()
        assert said[:2] == ["stopped", "ENOSPC"] and int(said[2]) < 300, (out.stdout, out.stderr)
        assert shutil.disk_usage(home).total < 400 * 2**20  # the home is a file system of its own
        assert free - shutil.disk_usage("/").free < 350 * 2**20  # the machine's disk lost no more than the home's
        other = run_as("learner02", [PYTHON, "-c", "import os; open(os.path.expanduser('~/ok'), 'w').write('x')"])
        assert other.returncode == 0, other.stderr  # the other learner writes as before
    finally:
        run_as("learner01", ["rm", "-f", str(home / "fill")])


def test_a_learner_s_class_file_fills_neither_the_machine_s_disk_nor_the_others_room(workshop: Workshop) -> None:
    st = workshop.st
    mine, theirs = (st.class_dir / f"{who}{classlog.SUFFIX}" for who in ("learner01", "learner02"))
    free = shutil.disk_usage("/").free
    out = run_as("learner01", [PYTHON, "-c", FILL, str(mine)], timeout=120)
    try:
        said = out.stdout.split()
        assert said[:2] == ["stopped", "ENOSPC"] and int(said[2]) < 10, (out.stdout, out.stderr)
        assert free - shutil.disk_usage("/").free < 16 * 2**20
        # while learner01's file is full, learner02's records are written as before
        other = _append_as("learner02", theirs, _record(learner="learner02", lab="mirrored", message="after") + "\n")
        assert other.returncode == 0, other.stderr
        reading = classlog.read(st.class_dir)  # the view is still built, the flood named
        assert any("learner01" in problem for problem in reading.problems), reading.problems
        assert any(r.learner == "learner02" and r.message == "after" for r in reading.records)
    finally:
        run_as("learner01", ["truncate", "--size", "0", str(mine)])
        run_as("learner02", ["truncate", "--size", "0", str(theirs)])


def test_a_fork_bomb_stops_at_pids_max(workshop: Workshop) -> None:
    procs, _ = _group_files("learner01")
    uid = _user("learner01").pw_uid
    start = time.monotonic()
    try:
        out = run_as("learner01", [PYTHON, "-c", BOMB], timeout=60, procs=procs, start_new_session=True)
        born = int(out.stdout.split()[0])
        took = time.monotonic() - start
        assert 0 < born < PIDS, out  # the rest were refused by the kernel
        assert len(leftovers.processes_of({uid})) <= PIDS
    finally:
        leftovers.stop_processes({uid})
    assert leftovers.processes_of({uid}) == []
    print(f"\nfork bomb under pids.max={PIDS}: {born} children, then fork failed; {took:.1f} s")


def test_a_memory_hog_is_ended_at_the_memory_limit(workshop: Workshop) -> None:
    procs, _ = _group_files("learner02")
    uid = _user("learner02").pw_uid
    start = time.monotonic()
    try:
        out = run_as("learner02", [PYTHON, "-c", HOG], timeout=60, procs=procs)
    finally:
        leftovers.stop_processes({uid})
    took = time.monotonic() - start
    assert out.returncode == -signal.SIGKILL and "NOT STOPPED" not in out.stdout, out  # the kernel's OOM killer
    print(f"\nmemory hog under {MEMORY}: killed after {took:.1f} s")


# --- kill only what was started ------------------------------------------------------------------------------


def test_a_reused_pid_in_the_state_is_not_signalled() -> None:
    canary = _canary()
    try:
        real = Started.of(canary.pid)
        for stale in (Started(canary.pid, real.create_time - 3600, real.cmdline),
                      Started(canary.pid, real.create_time, ("jupyterhub", "-f", "x"))):
            assert stale.process() is None and stale.signal(signal.SIGKILL) is False
            hub.stop(stale, "", grace=0.5)
            assert canary.poll() is None  # still running
        assert real.alive() and Started.from_dict(real.to_dict()) == real
        assert Started.from_dict({"pid": "x"}) is None and Started.from_dict(None) is None
    finally:
        canary.kill()
        canary.wait()


def test_no_kill_by_name_in_the_workshop() -> None:
    folder = Path(started.__file__).parent
    for path in folder.glob("*.py"):
        text = path.read_text()
        for word in ("pkill", "killall", "os.kill(", ".name() =="):
            assert word not in text, (path.name, word)


# --- down: leftovers and stale pids --------------------------------------------------------------------------


def test_down_after_stale_pids_removes_everything_and_kills_nothing_else(workshop: Workshop) -> None:
    st = workshop.st
    uid = _user("learner01").pw_uid
    left = subprocess.Popen(["sleep", "600"], preexec_fn=becomes("learner01"), start_new_session=True,  # noqa: PLW1509
                            stdin=subprocess.DEVNULL)
    crontab = workshop.spools[0] / "learner01"
    crontab.write_text("* * * * * touch /tmp/x\n")  # as crontab(1) leaves it: the learner's file in the spool
    os.chown(crontab, uid, -1)
    fake = Started.of(workshop.fake_hub.pid)  # as after a reboot: the hub's pid now names another process
    data = json.loads(st.file.read_text())
    data["hub"] = {**fake.to_dict(), "create_time": fake.create_time - 86400}
    st.file.write_text(json.dumps(data))
    removed = lifecycle.down(str(st.folder))
    left.wait(10)
    assert workshop.fake_hub.poll() is None  # the canary with the state's pid lives
    assert str(crontab) in removed and not crontab.exists()
    assert not accounts.user_exists("learner01") and not st.folder.exists()
    assert not any("JupyterHub" in r for r in removed)
