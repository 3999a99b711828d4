"""The workshop's limits on a systemd host (:mod:`labkit.workshop.scopes`), in a container that boots systemd.

A Debian root file system with systemd (``mmdebstrap``, cached under ``~/.cache/labkit/systemd-test``) is imported
into podman and booted with ``/sbin/init`` as PID 1; the checkout is mounted read-only at ``/src``, and the
container's own ``python3`` imports ``labkit.workshop.scopes`` from it (the workshop's modules import only the
standard library). Inside it, as root, as the hub is: the probe passes; a learner's command started the way the
spawner starts a server (``scopes.argv`` + ``scopes.preexec``) runs as the learner with the learner's groups (not
root's), in the learner's scope; a fork bomb stops at ``TasksMax``, a memory hog is killed at ``MemoryMax``, two
busy processes get no more than ``CPUQuota``. In a default container, where systemd boots but cannot limit (its
controllers are read-only), the probe refuses. The containers and the image are removed afterwards; nothing made
is left. About 15 s with the root file system cached (30 s more to make it). Needs root, mmdebstrap, podman and
runc; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import paths
from helpers.learner import BOMB, HOG

from labkit.deploy.image import build, recipe

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # builds and boots a systemd container: make test-heavy

PREFIX = "labkit-test-systemd-"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "passwd")
LEARNER, OTHER_GROUP = "learner01", "labkit-class"
CORES, MEMORY, PIDS = 1.5, 256 * 2**20, 64

# Run by the container's python3 as root (PYTHONPATH=/src): each case through labkit's own code, as JSON.
DRIVER = r'''
import json, os, subprocess, sys, time
from labkit.workshop import scopes
from labkit.workshop.limits import Limits

asked = Limits(float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
learner = sys.argv[5]
IDENTITY = """
import json, os
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "cwd": os.getcwd(),
                  "cgroup": open("/proc/self/cgroup").read()}))
"""
SPIN = """
import os, time
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + 4
        while time.monotonic() < end:
            pass
        os._exit(0)
    kids.append(pid)
start = time.monotonic()
for pid in kids:
    os.waitpid(pid, 0)
t = os.times()
print(t.children_user + t.children_system, time.monotonic() - start, flush=True)
"""

def as_learner(code, timeout=120):
    scopes.end(learner)
    start = time.monotonic()
    out = subprocess.run([*scopes.argv(learner, asked), "python3", "-c", code], capture_output=True, text=True,
                         preexec_fn=scopes.preexec(learner, asked), timeout=timeout)
    return {"rc": out.returncode, "out": out.stdout, "err": out.stderr[-2000:], "s": time.monotonic() - start,
            "shown": scopes.show(scopes.unit(learner))}

case = sys.argv[1]
if case == "probe":
    start = time.monotonic()
    result = {"available": scopes.available(), "problem": scopes.probe(asked), "s": time.monotonic() - start,
              "odd": scopes.probe(Limits(1.23456, 100 * 2**20 + 5, 2048))}  # 123.46%, not a whole page
elif case == "bare":  # systemd-run --uid alone, from a root with group 0 (as after sudo): which groups?
    out = subprocess.run([*scopes.argv(learner, asked), "python3", "-c", IDENTITY], capture_output=True, text=True,
                         preexec_fn=lambda: os.setgroups([0]))
    result = {"rc": out.returncode, "out": out.stdout, "err": out.stderr}
else:
    result = as_learner({"identity": IDENTITY, "bomb": BOMB, "hog": HOG, "spin": SPIN}[case])
    if case == "bomb":
        time.sleep(0.5)
        result["tasks"] = subprocess.run(["systemctl", "show", "--property=TasksCurrent", "--value",
                                          scopes.unit(learner)], capture_output=True, text=True).stdout.strip()
    scopes.end(learner)
    result["left"] = scopes.show(scopes.unit(learner)).get("ActiveState")
print(json.dumps(result))
'''
DRIVER = f"BOMB = {BOMB!r}\nHOG = {HOG!r}\n" + DRIVER  # the fork bomb and memory hog of the other suites


def _podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **build.podman_env()}
    out = subprocess.run([*recipe.podman(), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-3000:]}")
    return out


def _rootfs() -> Path:
    """The root file system with systemd, made once (about a minute) and kept in the cache."""
    folder = build.cache_dir() / "systemd-test"
    tar = folder / f"{recipe.host_suite()}-systemd.tar"
    if tar.is_file():
        return tar
    folder.mkdir(parents=True, exist_ok=True)
    partial = tar.with_suffix(".partial")
    out = subprocess.run(["mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar",
                          "--include=" + ",".join(PACKAGES), recipe.host_suite(), str(partial),
                          str(recipe.host_sources())], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        partial.unlink(missing_ok=True)
        raise AssertionError(f"mmdebstrap exited {out.returncode}:\n{out.stderr[-3000:]}")
    partial.rename(tar)
    return tar


def _ours() -> tuple[list[str], list[str]]:
    names = [n for n in _podman("ps", "-a", "--format", "{{.Names}}").stdout.split() if n.startswith(PREFIX)]
    images = [i for i in _podman("images", "--format", "{{.Repository}}").stdout.split() if PREFIX in i]
    return names, images


def _boot(tag: str, name: str, *flags: str) -> None:
    """Start ``tag`` as ``name`` with systemd as PID 1 and the checkout at /src; wait until it has booted."""
    _podman("run", "--detach", "--systemd=always", *flags, f"--name={name}", f"--volume={paths.ROOT}:/src:ro", tag,
            "/sbin/init")
    start = time.monotonic()
    while True:  # until systemd listens (its bus socket appears a moment after the container starts)
        state = _podman("exec", name, "systemctl", "is-system-running", "--wait", timeout=120, check=False)
        if "Failed to connect to bus" not in state.stderr or time.monotonic() - start > 60:
            break
        time.sleep(0.2)
    print(f"\nsystemd in {' '.join(flags) or 'a default container'}: {state.stdout.strip()} after "
          f"{time.monotonic() - start:.1f} s")
    assert state.stdout.strip() in ("running", "degraded"), state


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    missing = build.missing_tools()
    if missing:
        pytest.skip("needs " + ", ".join(missing))
    tar = _rootfs()
    tag = f"localhost/{PREFIX}{uuid.uuid4().hex[:8]}:latest"
    try:
        _podman("import", str(tar), tag)
        yield tag
    finally:
        for name in _ours()[0]:
            _podman("rm", "--force", "--time=5", name, check=False)
        _podman("rmi", "--force", tag, check=False)
        assert _ours() == ([], []), "a container or image of the test is left"


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """A systemd host: privileged, so that the v1 controllers are mounted writable, and in a private cgroup
    namespace, so that the paths systemd reads in /proc/self/cgroup are the ones mounted (with the host's, it
    finds no cpu, memory or pids hierarchy of its own and limits nothing)."""
    name = PREFIX + uuid.uuid4().hex[:8]
    try:
        _boot(image, name, "--privileged", "--cgroupns=private")
        _podman("exec", name, "groupadd", OTHER_GROUP)
        _podman("exec", name, "useradd", "--create-home", "--groups", OTHER_GROUP, LEARNER)
        yield name
    finally:
        _podman("rm", "--force", "--time=5", name, check=False)


def _run(container: str, case: str) -> dict:
    out = _podman("exec", "--env=PYTHONPATH=/src", container, "python3", "-c", DRIVER, case, str(CORES), str(MEMORY),
                  str(PIDS), LEARNER, timeout=300)
    return json.loads(out.stdout.splitlines()[-1])


def _id(container: str, *args: str) -> str:
    return _podman("exec", container, "id", *args, LEARNER).stdout.strip()


def test_the_probe_passes_on_a_systemd_host(container: str) -> None:
    result = _run(container, "probe")
    assert result["available"] is True and result["problem"] is None and result["odd"] is None, result
    print(f"\nscopes.probe({CORES:g} cores, {MEMORY >> 20} MiB, {PIDS} tasks): passes in {result['s']:.2f} s")


def test_the_server_runs_as_the_learner_with_the_learner_s_groups_in_their_scope(container: str) -> None:
    result = _run(container, "identity")
    assert result["rc"] == 0, result
    me = json.loads(result["out"])
    assert (me["uid"], me["gid"]) == (int(_id(container, "-u")), int(_id(container, "-g")))
    assert me["groups"] == sorted(int(g) for g in _id(container, "-G").split())  # the learner's, not root's
    assert 0 not in me["groups"] and me["cwd"] == f"/home/{LEARNER}"
    assert f"/labkit-workshop-{LEARNER}.scope" in me["cgroup"]
    bare = _run(container, "bare")  # systemd-run --uid without the spawner's preexec
    print(f"\nas the learner: uid {me['uid']}, groups {me['groups']}; systemd-run --uid alone from a root with "
          f"group 0: groups {json.loads(bare['out'])['groups'] if bare['rc'] == 0 else bare}")


def test_a_fork_bomb_stops_at_tasks_max(container: str) -> None:
    result = _run(container, "bomb")
    born = int(result["out"].split()[0])
    assert 0 < born < PIDS, result
    assert result["left"] in ("inactive", "", None), result  # scopes.end ended the children
    print(f"\nfork bomb under TasksMax={PIDS}: {born} children, then fork failed; {result['s']:.2f} s "
          f"(tasks in the scope: {result.get('tasks')})")


def test_a_memory_hog_is_killed_at_memory_max(container: str) -> None:
    result = _run(container, "hog")
    assert result["rc"] == -9 and "NOT STOPPED" not in result["out"], result
    print(f"\nmemory hog under MemoryMax={MEMORY >> 20}M: killed (SIGKILL) after {result['s']:.2f} s")


def test_two_busy_processes_get_no_more_than_the_cpu_quota(container: str) -> None:
    result = _run(container, "spin")
    cpu, wall = (float(x) for x in result["out"].split())
    assert cpu / wall < CORES * 1.1, result
    print(f"\ntwo busy processes under CPUQuota={CORES * 100:g}%: {cpu:.2f} s of CPU in {wall:.2f} s "
          f"({cpu / wall:.2f} cores)")


def test_the_probe_refuses_where_systemd_cannot_limit(image: str) -> None:
    """A default container: systemd boots and accepts the scope's properties (``systemctl show`` lists them), but
    the controllers are mounted read-only and its scope gets no cpu, memory or pids group: nothing is limited.
    The probe reads the kernel's files, not only systemd's answer, and refuses."""
    name = PREFIX + uuid.uuid4().hex[:8]
    try:
        _boot(image, name)
        result = _run(name, "probe")
    finally:
        _podman("rm", "--force", "--time=5", name, check=False)
    assert result["available"] is True and "systemd made no cpu group for the scope" in result["problem"], result
    print(f"\nscopes.probe in a container whose controllers are read-only: {result['problem'][:160]}")
