"""A workshop tried as a hostile learner would: one real hub for the module, learners who plant links and
FIFOs in their home before their first server start, rename their course while it is copied, bring their own
server configuration and ``sitecustomize``, and try to read the answers. The targets are canaries in a folder
of root's made here, never system files; each test checks them unchanged (content, owner, mode), and the
module checks that nothing is left behind (users, processes, modes). Needs root, JupyterHub and the proxy
(or npm); skipped otherwise."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from helpers import aio, paths
from helpers.hubconf import hub_missing
from tornado import httpclient, websocket

from labkit.core import proc, tfconfig
from labkit.workshop import accounts, asuser, homes, hub, hubconfig, leftovers, lifecycle, serverlog, worlds

SOURCE = paths.ROOT
ANSWERS = [SOURCE / "solutions" / "fashion_mnist_solution.py", SOURCE / "course" / "INSTRUCTOR.md",
           SOURCE / ".git" / "HEAD", SOURCE / "tests" / "conftest.py"]


# every test uses the module's hub (about 35 s to start with two servers, 5 s to stop)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(hub_missing() is not None, reason=str(hub_missing()))]


@dataclass(frozen=True)
class Canaries:
    """Root's folder of targets: ``folder/`` (with a file in it) and ``file``."""

    top: Path

    folder = property(lambda self: self.top / "folder")
    file = property(lambda self: self.top / "file")

    def state(self) -> dict[str, tuple]:
        """Every entry below ``top``: kind, owner, group, mode and content."""
        seen = {}
        for folder, dirs, files in os.walk(self.top):
            for path in [Path(folder), *(Path(folder) / n for n in (*dirs, *files))]:
                st = path.lstat()
                body = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
                seen[str(path)] = (stat.S_IFMT(st.st_mode), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), body)
        return seen


def _make_canaries() -> Canaries:
    top = Path(tempfile.mkdtemp(prefix="labkit-canary-", dir="/tmp"))
    top.chmod(0o755)
    c = Canaries(top)
    c.folder.mkdir(mode=0o755)
    (c.folder / "inside").write_text("root's file in root's folder\n")
    c.file.write_text("root's file\n")
    c.file.chmod(0o644)
    return c


def _modes() -> dict[str, int]:
    """The modes ``up`` may change: /root and what is directly in it, the course's answers and their folders."""
    paths_ = [Path("/root"), *Path("/root").iterdir(), *(a.parent for a in ANSWERS), *ANSWERS]
    return {str(p): p.lstat().st_mode for p in paths_ if os.path.lexists(p)}


def _snapshot() -> dict[str, object]:
    return {"users": {p.pw_name for p in pwd.getpwall()}, "groups": {g.gr_name for g in grp.getgrall()},
            "homes": set(os.listdir("/home")), "modes": _modes()}


def as_learner(who: str, code: str, *args: str, timeout: float = 30) -> asuser.Outcome:
    """Python ``code`` run by the learner ``who`` (a real process with their ids, as their own would be)."""
    return asuser.run(asuser.Learner.of(who), ["-c", code, *args], timeout)


@dataclass
class Workshop:
    st: lifecycle.State
    canaries: Canaries
    admin: str  # an API token of the instructor
    tokens: dict[str, str]
    started: dict[str, float]  # learner -> seconds from the start request to a ready server

    @property
    def release(self) -> Path:
        return self.st.folder / "release"

    def server(self, who: str) -> str:
        """The learner's server on their own origin (``NAME.localhost``, see :func:`_localhost_names`)."""
        return f"http://{who}.localhost:{self.st.port}/user/{who}/"


def _localhost_names(mp: pytest.MonkeyPatch) -> None:
    """Resolve ``NAME.localhost`` to this machine in this process, as browsers do (the system resolver may not)."""
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real(host, *args, **kw)

    mp.setattr(socket, "getaddrinfo", getaddrinfo)


def _token(st: lifecycle.State, who: str) -> str:
    out = subprocess.run([hub.jupyterhub(), "token", "-f", str(st.config), who], capture_output=True, text=True,
                         cwd=st.private, timeout=60, check=True)
    return out.stdout.strip().splitlines()[-1]


def _api(url: str, token: str, method: str = "GET") -> dict:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"},
                                     data=b"{}" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body else {}


def _ready(st: lifecycle.State, admin: str, who: str) -> bool:
    server = _api(f"{st.url}hub/api/users/{who}", admin).get("servers", {}).get("")
    return bool(server and server.get("ready"))


PLANT = """
import os, sys
home, canary_folder, canary_file, kinds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
profile = os.path.join(home, ".profile")
own = "import os, sys\\nopen(os.path.expanduser('~/{}'), 'a').write(repr(sys.argv) + chr(10))"
if "links" in kinds or "fifo" in kinds:
    os.remove(profile) if os.path.lexists(profile) else None
    os.symlink(canary_folder, os.path.join(home, ".keras"))
if "links" in kinds:
    os.symlink(canary_file, profile)
if "fifo" in kinds:
    os.mkfifo(profile)
if "own" in kinds:  # the learner's own server configuration and Python start-up files, each leaving a mark
    os.makedirs(os.path.join(home, ".jupyter"))
    for name in ("jupyter_server_config.py", "jupyter_config.py", "jupyter_lab_config.py"):
        open(os.path.join(home, ".jupyter", name), "w").write(own.format("own-config-ran"))
    site = os.path.join(home, ".local", "lib", "python3.11", "site-packages")
    os.makedirs(site)
    sys.argv[5:] = [home, site]
for folder in sys.argv[5:]:  # "course": the folders given
    for name in ("sitecustomize.py", "usercustomize.py"):
        open(os.path.join(folder, name), "w").write(own.format("own-python-ran"))
"""


@pytest.fixture(scope="module")
def workshop() -> Iterator[Workshop]:
    state = Path(f"/run/labkit-workshop-hostile-{os.getpid()}")
    if lifecycle.State.load() is not None or accounts.user_exists("learner01") or state.exists():
        pytest.skip("a workshop is up on this machine already")
    canaries = _make_canaries()
    before, canary_state = _snapshot(), canaries.state()
    uids: set[int] = set()
    job = ""
    mp = pytest.MonkeyPatch()
    _localhost_names(mp)
    try:
        port = tfconfig.free_ports(1)[0]  # learners at NAME.localhost, which resolves to this machine
        st, _ = lifecycle.up(lifecycle.Plan(3, port=port, folder=str(state), no_limits=True,
                             subdomain_host=f"http://localhost:{port}"), say=print)
        uids, job = accounts.uids_of(st.made["users"]), st.job_id
        # before their first start: learner01 plants links to root's canaries, learner02 a FIFO as ~/.profile,
        # their own server configuration and Python start-up files, and a ~/course of their own
        for who, kind in (("learner01", "links"), ("learner02", "fifo,own")):
            home = str(asuser.Learner.of(who).home)
            done = as_learner(who, PLANT, home, str(canaries.folder), str(canaries.file), kind)
            assert done.code == 0, done.err
        admin = _token(st, st.instructor)
        tokens = {w: _token(st, w) for w in ("learner01", "learner02")}
        asked = time.monotonic()
        for who in tokens:
            _api(f"{st.url}hub/api/users/{who}/server", admin, "POST")
        started = {}
        while len(started) < len(tokens) and time.monotonic() - asked < 180:
            for who in tokens:
                if who not in started and _ready(st, admin, who):
                    started[who] = time.monotonic() - asked
            time.sleep(0.2)
        assert len(started) == 2, (started, hub.tail(st.log, 4000))
        print(f"\nservers ready after {json.dumps({k: round(v, 1) for k, v in started.items()})} s")
        yield Workshop(st, canaries, admin, tokens, started)
    finally:
        mp.undo()
        removed = lifecycle.down(str(state))
        after = _snapshot()
        try:
            for kind in ("users", "groups", "homes", "modes"):
                assert after[kind] == before[kind], (kind, removed)
            assert not state.exists() and canaries.state() == canary_state
            assert leftovers.processes_of(uids) == [] and leftovers.temp_files(uids) == []
            assert not job or proc.marked(job) == []
        finally:
            shutil.rmtree(canaries.top)


def _owners_below(top: Path) -> set[int]:
    owners = {top.lstat().st_uid}
    for folder, dirs, files in os.walk(top):
        owners |= {(Path(folder) / n).lstat().st_uid for n in (*dirs, *files)}
    return owners


def test_links_planted_before_the_first_start_lead_root_nowhere(workshop: Workshop) -> None:
    w, me = workshop, asuser.Learner.of("learner01")
    assert w.canaries.state() == _make_state(w.canaries)  # nothing created, chowned or written through the links
    assert os.readlink(me.home / ".keras") == str(w.canaries.folder)
    assert os.readlink(me.home / ".profile") == str(w.canaries.file)
    assert (me.home / homes.COURSE / "labs" / "fashion_mnist.py").is_file()
    assert _owners_below(me.home) == {me.uid}  # root wrote nothing in the home
    log = hub.tail(w.st.log, 200_000)
    assert "learner01: " in log and f"{me.home}/.profile: left alone" in log
    assert f"{me.home / homes.KERAS_DATA}: not linked" in log or not w.st.data_dir.is_dir()


def _make_state(c: Canaries) -> dict[str, tuple]:
    """What the canaries were made as (root's, as :func:`_make_canaries` left them)."""
    folder, inside, file = c.folder, c.folder / "inside", c.file
    return {str(c.top): (stat.S_IFDIR, 0, 0, 0o755, None), str(folder): (stat.S_IFDIR, 0, 0, 0o755, None),
            str(inside): (stat.S_IFREG, 0, 0, 0o644, b"root's file in root's folder\n"),
            str(file): (stat.S_IFREG, 0, 0, 0o644, b"root's file\n")}


def _server(who: str) -> psutil.Process:
    for p in leftovers.processes_of(accounts.uids_of([who])):
        if "jupyterhub-singleuser" in " ".join(p.cmdline()):
            return p
    raise AssertionError(f"no server of {who}")


def test_the_learners_own_configuration_and_python_files_are_not_loaded(workshop: Workshop) -> None:
    w, me = workshop, asuser.Learner.of("learner02")
    assert stat.S_ISFIFO((me.home / ".profile").lstat().st_mode)  # left alone, and the start did not hang
    assert w.started["learner02"] < 120
    server = _server("learner02")
    env = server.environ()
    assert env["PYTHONPATH"] == str(w.release) and env["PYTHONNOUSERSITE"] == "1"
    assert env["JUPYTERHUB_DISABLE_USER_CONFIG"] == "1" and str(me.home) not in env["PATH"]
    assert _owners_below(w.release) == {0} and stat.S_IMODE(w.release.stat().st_mode) == 0o755
    assert f"{me.home}/.profile: not a regular file" in hub.tail(w.st.log, 200_000)
    done = as_learner("learner02", PLANT, str(me.home), "/nonexistent", "/nonexistent", "course",
                      str(me.home / homes.COURSE))  # where PYTHONPATH pointed before: the kernel's folder
    assert done.code == 0, done.err
    base = f"{w.server('learner02')}api/"
    kernel = _api(base + "kernels", w.tokens["learner02"], "POST")["id"]
    try:
        assert proc.wait_until(lambda: _kernel(kernel) is not None, 60)
        pid, connection = _kernel(kernel)
        info = json.loads(Path(connection).read_text())
        assert info["transport"] == "ipc" and info["ip"].startswith(str(me.home)), info
        assert psutil.Process(pid).net_connections("inet") == []  # nothing on loopback TCP for others to reach
        url = base.replace("http", "ws", 1) + f"kernels/{kernel}/channels"
        said = aio.run(_execute(url, w.tokens["learner02"], "import labkit; print(6 * 7, labkit.__file__)"))
        assert said.split() == ["42", str(w.release / "labkit" / "__init__.py")]  # the release's labkit, over IPC
    finally:
        urllib.request.urlopen(urllib.request.Request(base + f"kernels/{kernel}", method="DELETE", headers={
            "Authorization": f"token {w.tokens['learner02']}"}), timeout=30).close()
    assert not (me.home / "own-config-ran").exists() and not (me.home / "own-python-ran").exists()
    # the planted files are live: run by hand, each leaves its mark
    control = as_learner("learner02", "import os, runpy; [runpy.run_path(os.path.expanduser(p)) for p in "
                         "('~/.jupyter/jupyter_server_config.py', '~/course/sitecustomize.py')]")
    assert control.code == 0 and (me.home / "own-config-ran").exists() and (me.home / "own-python-ran").exists()


async def _execute(url: str, token: str, code: str, timeout: float = 60) -> str:
    """Run ``code`` in a kernel through its server's websocket (as JupyterLab does); what it printed."""
    ws = await websocket.websocket_connect(httpclient.HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    msg_id = uuid.uuid4().hex
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                   "version": "5.3"}, "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False}}))

    async def printed() -> str:
        out = ""
        while True:
            message = json.loads(await ws.read_message())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "stream":
                out += message["content"]["text"]
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                return out

    try:
        return await asyncio.wait_for(printed(), timeout)
    finally:
        ws.close()


def _kernel(kernel_id: str) -> tuple[int, str] | None:
    for p in leftovers.processes_of(accounts.uids_of(["learner02"])):
        line = p.cmdline()
        for i, arg in enumerate(line[:-1]):
            if arg == "-f" and kernel_id in line[i + 1]:
                return p.pid, line[i + 1]
    return None


READ = """
import json, sys
out = {}
for path in sys.argv[1:]:
    try:
        open(path, "rb").read(1)
        out[path] = "read"
    except OSError as e:
        out[path] = type(e).__name__
print(json.dumps(out))
"""


def test_a_learner_reads_the_release_and_not_the_answers(workshop: Workshop) -> None:
    closed = [Path(p) for p, mode in workshop.st.made["modes"].items()
              if mode & 0o004 and not os.stat(p).st_mode & 0o004 and Path(p).is_file()]
    release = workshop.release / "labkit" / "__init__.py"
    targets = [*ANSWERS, *closed, release]
    done = as_learner("learner03", READ, *map(str, targets))
    assert done.code == 0, done.err
    seen = json.loads(done.out)
    assert seen.pop(str(release)) == "read"
    assert set(seen.values()) == {"PermissionError"}, seen
    assert SOURCE / "course" / "INSTRUCTOR.md" in closed


DROPPED = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from labkit.workshop import asuser
asuser.verify_dropped(os.getuid(), os.getgid(), tuple(os.getgroups()))
tries = {}
for name, attempt in (("setuid", lambda: os.setuid(0)), ("seteuid", lambda: os.seteuid(0)),
                      ("setgroups", lambda: os.setgroups([0])), ("write", lambda: open(sys.argv[2], "a"))):
    try:
        attempt()
        tries[name] = "done"
    except OSError as e:
        tries[name] = type(e).__name__
print(json.dumps({"ids": [os.getresuid(), os.getresgid(), os.getgroups()], "tries": tries,
                  "capabilities": asuser.capabilities()}))
"""


def test_the_child_is_the_learner_and_cannot_become_root(workshop: Workshop) -> None:
    me = asuser.Learner.of("learner03")
    done = as_learner("learner03", DROPPED, str(workshop.release), str(workshop.canaries.file))
    assert done.code == 0, done.err
    seen = json.loads(done.out)
    assert seen["ids"] == [[me.uid] * 3, [me.gid] * 3, list(me.groups)] and 0 not in seen["ids"][2]
    assert set(seen["tries"].values()) == {"PermissionError"} and seen["capabilities"] == [0, 0, 0], seen
    assert workshop.canaries.state() == _make_state(workshop.canaries)


def test_a_child_past_its_timeout_is_killed_with_what_it_started(workshop: Workshop) -> None:
    code = "import subprocess, time; subprocess.Popen(['sleep', '300']); print('started', flush=True); time.sleep(300)"
    done = as_learner("learner03", code, timeout=1.0)
    assert done.timed_out and done.seconds < 5 and done.out.startswith("started")

    def sleeping(p: psutil.Process) -> bool:
        try:
            return "sleep" in " ".join(p.cmdline())
        except psutil.Error:  # ended (a zombie) since it was listed
            return False

    assert [p for p in leftovers.processes_of(accounts.uids_of(["learner03"])) if sleeping(p)] == []


RACE = """
import os, sys, time
home, canary, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
end, moved = time.monotonic() + seconds, 0
while time.monotonic() < end:
    for name in os.listdir(home):
        if name == "course" or name.startswith(".course-"):
            path = os.path.join(home, name)
            try:
                os.rename(path, os.path.join(home, f"moved-{moved}"))
                moved += 1
                os.symlink(canary, path)  # root's folder where the copy was going
            except OSError:
                pass
    for name in os.listdir(home):
        if name == "course" and os.path.islink(os.path.join(home, name)):
            os.remove(os.path.join(home, name))  # so that the next start copies again
print(moved)
"""


def test_a_course_renamed_while_it_is_copied_leads_nowhere(workshop: Workshop) -> None:
    me, c = asuser.Learner.of("learner03"), workshop.canaries
    outcome: list[asuser.Outcome] = []
    racer = threading.Thread(target=lambda: outcome.append(as_learner("learner03", RACE, str(me.home), str(c.folder),
                                                                       "6", timeout=30)))
    racer.start()
    reports = []
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        reports.append(homes.give(me, workshop.release, workshop.st.data_dir, 20))
    racer.join()
    assert outcome and outcome[0].code == 0, outcome
    print(f"\n{len(reports)} home preparations raced by {outcome[0].out.strip()} renames")
    assert int(outcome[0].out) > 0 and len(reports) > 3
    assert c.state() == _make_state(c)  # whatever the learner did, nothing was written, linked or chowned there
    assert _owners_below(me.home) == {me.uid}
    assert all(not r.notes or "took more than" not in r.notes[0] for r in reports)


def test_a_fifo_and_links_in_a_fresh_home_are_left_alone_by_the_child(workshop: Workshop) -> None:
    me, c = asuser.Learner.of("learner03"), workshop.canaries
    for name in ("course", ".keras", ".profile"):
        path = me.home / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
    done = as_learner("learner03", PLANT, str(me.home), str(c.folder), str(c.file), "fifo")
    assert done.code == 0, done.err
    start = time.monotonic()
    report = homes.give(me, workshop.release, workshop.st.data_dir, 20)
    took = time.monotonic() - start
    assert report.course_written and took < 10, (report, took)
    assert any("not linked" in n for n in report.notes) and any(".profile: not a regular" in n for n in report.notes)
    assert stat.S_ISFIFO((me.home / ".profile").lstat().st_mode)
    assert c.state() == _make_state(c) and _owners_below(me.home) == {me.uid}


def _get(url: str, token: str) -> tuple[int, str]:
    """GET ``url`` without following redirects: its status and the body's start."""
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=30) as r:
            return r.status, r.read(2000).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, f"{e.headers.get('Location', '')} {e.read(2000).decode(errors='replace')}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kw: object) -> None:
        return None


def test_each_learner_is_served_from_an_origin_of_their_own(workshop: Workshop) -> None:
    w, port = workshop, workshop.st.port
    assert hubconfig.SHARED_ORIGIN not in w.st.problems  # the shared-origin risk is not said: it is not there
    code, body = _get(w.server("learner01") + "api/status", w.tokens["learner01"])
    assert code == 200 and "started" in body, (code, body)  # the learner's own server, on its own origin
    for origin in (f"http://localhost:{port}", f"http://learner02.localhost:{port}", w.st.url.rstrip("/")):
        code, body = _get(f"{origin}/user/learner01/api/status", w.tokens["learner01"])
        assert not (code == 200 and "started" in body), (origin, code, body)  # never learner01's server there
        print(f"\n{origin}/user/learner01/api/status: {code} {body[:120]!r}")


# Each learner's server in a world of its own (labkit.workshop.worlds): their ports, /tmp and output their own.

LISTEN = """
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port}))
s.listen()
def serve():
    while True:
        c, _ = s.accept()
        c.sendall(b"learner02's secret")
        c.close()
threading.Thread(target=serve, daemon=True).start()
print("listening")
"""
REACH = """
import socket
for host in {hosts!r}:
    try:
        with socket.create_connection((host, {port}), timeout=3) as c:
            print(host, "REACHED", c.recv(64).decode())
    except OSError as e:
        print(host, "refused", type(e).__name__)
"""


class Kernels:
    """Kernels of learners' servers, run as JupyterLab runs them (the server's API and websocket)."""

    def __init__(self, w: Workshop) -> None:
        self.w = w
        self.started: list[tuple[str, str]] = []

    def start(self, who: str) -> str:
        kernel = _api(f"{self.w.server(who)}api/kernels", self.w.tokens[who], "POST")["id"]
        self.started.append((who, kernel))
        return kernel

    def run(self, who: str, kernel: str, code: str) -> str:
        url = f"{self.w.server(who)}api/kernels/{kernel}/channels".replace("http", "ws", 1)
        return aio.run(_execute(url, self.w.tokens[who], code, timeout=120))

    def close(self) -> None:
        for who, kernel in self.started:
            urllib.request.urlopen(urllib.request.Request(
                f"{self.w.server(who)}api/kernels/{kernel}", method="DELETE",
                headers={"Authorization": f"token {self.w.tokens[who]}"}), timeout=30).close()


@pytest.fixture
def kernels(workshop: Workshop) -> Iterator[Kernels]:
    k = Kernels(workshop)
    try:
        yield k
    finally:
        k.close()


def test_a_learner_does_not_reach_another_learner_s_ports(workshop: Workshop, kernels: Kernels) -> None:
    addresses = hubconfig_addresses(workshop)
    port = tfconfig.free_ports(1)[0]
    theirs = kernels.start("learner02")
    assert kernels.run("learner02", theirs, LISTEN.format(port=port)).strip() == "listening"
    own = kernels.run("learner02", theirs, REACH.format(hosts=["127.0.0.1"], port=port))
    assert "127.0.0.1 REACHED learner02's secret" in own  # their own loopback is theirs
    mine = kernels.start("learner01")
    tried = kernels.run("learner01", mine, REACH.format(
        hosts=["127.0.0.1", addresses["learner02"], worlds.HUB, socket.gethostname()], port=port))
    assert "REACHED" not in tried and tried.count("refused") == 4, tried
    with socket.create_connection((addresses["learner02"], port), timeout=5) as c:  # the hub's side reaches it
        assert c.recv(64) == b"learner02's secret"
    # learner01 outside their world (as through sshd's port forwarding), on the machine's own network
    done = as_learner("learner01", REACH.format(hosts=[addresses["learner02"]], port=port))
    assert done.code == 0 and "REACHED" not in done.out and "refused" in done.out, (done.out, done.err)


def test_a_learner_reaches_nothing_else_the_machine_serves(workshop: Workshop, kernels: Kernels) -> None:
    """A service of root's on every interface (an sshd, a database) is not reached from a learner's network."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen()
    try:
        port = server.getsockname()[1]
        tried = kernels.run("learner01", kernels.start("learner01"), REACH.format(hosts=[worlds.HUB], port=port))
        assert "REACHED" not in tried and "refused" in tried, tried
    finally:
        server.close()


def hubconfig_addresses(w: Workshop) -> dict[str, str]:
    return {n.name: n.address for n in worlds.plan(w.st.made["worlds"])}


MPI = """
import os, socket, subprocess
print("planted" if os.path.isdir({folder!r}) else "absent")
done = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "hostname"],
                      capture_output=True, text=True, timeout=90)
print("mpirun", done.returncode, len(done.stdout.split()), done.stderr[-300:].replace(chr(10), " "))
"""


def test_another_learner_s_mpi_session_folder_cannot_be_taken(workshop: Workshop, kernels: Kernels) -> None:
    victim = pwd.getpwnam("learner02").pw_uid
    folder = f"/tmp/ompi.{socket.gethostname()}.{victim}"
    attacker = kernels.start("learner01")
    made = kernels.run("learner01", attacker, f"import os; os.makedirs({folder!r}, mode=0o700); print('made')")
    assert made.strip() == "made" and not os.path.exists(folder)  # in learner01's own /tmp only
    said = kernels.run("learner02", kernels.start("learner02"), MPI.format(folder=folder)).split()
    assert said[:4] == ["absent", "mpirun", "0", "2"], said


# The kernel's own copy of the output its server gave it (ipykernel keeps one): the same pipe as the server's.
FLOOD = """
import os
pipe = os.readlink(f"/proc/{{os.getppid()}}/fd/1")
out = next(fd for fd in range(3, 256) if os.path.exists(f"/proc/self/fd/{{fd}}")
           and os.readlink(f"/proc/self/fd/{{fd}}") == pipe)
for _ in range({times}):
    os.write(out, {line!r})
print("ok")
"""


def test_a_server_s_output_goes_to_a_bounded_file_of_its_own(workshop: Workshop, kernels: Kernels) -> None:
    st = workshop.st
    line = b"[I 2026-11-27 10:00:00.000 JupyterHub app:1] PLANTED by learner01\n"
    code = FLOOD.format(times=serverlog.LIMIT // len(line) + 20000, line=line)
    assert kernels.run("learner01", kernels.start("learner01"), code).strip() == "ok"
    log = st.private / "servers" / "learner01.log"
    assert proc.wait_until(lambda: log.exists() and log.stat().st_size >= serverlog.LIMIT, 30)
    info = log.stat()
    assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o600 and info.st_size <= serverlog.LIMIT + 200
    assert b"PLANTED" not in Path(st.log).read_bytes()


def test_server_options_a_learner_posts_are_dropped(workshop: Workshop) -> None:
    w = workshop
    token = w.tokens["learner03"] if "learner03" in w.tokens else _token(w.st, "learner03")
    body = json.dumps({"user_options": {"uid": "0", "gid": "0", "cmd": "id > /tmp/canary",
                                        "memory": "1G\nid > /tmp/canary"}}).encode()
    request = urllib.request.Request(f"{w.st.url}hub/api/users/learner03/server", method="POST", data=body,
                                     headers={"Authorization": f"token {token}"})
    urllib.request.urlopen(request, timeout=60).close()
    assert proc.wait_until(lambda: _ready(w.st, w.admin, "learner03"), 120), hub.tail(w.st.log, 3000)
    model = _api(f"{w.st.url}hub/api/users/learner03", w.admin)["servers"][""]
    assert model.get("user_options") in ({}, None), model
    server = _server("learner03")
    assert server.uids().real == pwd.getpwnam("learner03").pw_uid and "options ignored" in hub.tail(w.st.log, 100_000)
    _api(f"{w.st.url}hub/api/users/learner03/server", w.admin, "DELETE")


QUEUE_GARBAGE = """
import os, socket
path = os.environ["LABKIT_CHECK_QUEUE"]
for junk in (b"[" * 5000 + b"\\n", b"x" * 100_000, b'{"op": "take", "label": 1e400}\\n', b"\\xff\\xfe\\n"):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        s.sendall(junk)
        s.recv(4096)
    except OSError:
        pass
    s.close()
print("sent", oct(os.stat(os.path.dirname(path)).st_mode & 0o777), os.access(os.path.dirname(path), os.W_OK))
"""
QUEUE_TAKE = """
import time
from labkit.core import slots
start = time.monotonic()
with slots.queued("a step check") as waited:
    print("slot", round(time.monotonic() - start, 1))
"""


def test_the_check_queue_is_the_hub_s_and_no_learner_s_garbage_stops_another_s_check(
        workshop: Workshop, kernels: Kernels) -> None:
    said = kernels.run("learner01", kernels.start("learner01"), QUEUE_GARBAGE).split()
    assert said == ["sent", "0o755", "False"], said  # the queue's folder is the instructor's; learners only connect
    took = kernels.run("learner02", kernels.start("learner02"), QUEUE_TAKE).split()
    assert took[0] == "slot" and float(took[1]) < 10, took
