"""Cores, memory and processes per learner on a systemd host: each learner's server in a transient scope unit.

Where systemd is PID 1 it owns the control group tree, and a group made by hand below the hub's own fails
(``EBUSY`` on cgroup v2, see :mod:`labkit.workshop.limits`). There the workshop asks systemd instead: the
spawner starts each learner's server through ``systemd-run --scope`` (:func:`argv`), which registers its own
process as the scope ``labkit-workshop-<learner>.scope`` with the limits as the unit's properties
(``CPUQuota``, ``MemoryMax``, ``TasksMax``), becomes the learner (``--uid``) and then runs the server in place:
the server keeps the process id the hub watches, and everything it starts (kernels, terminals, ``mpirun``)
stays in the scope. systemd writes the limits to the kernel, in the cgroup v2 files or the v1 ones.

``systemd-run --uid`` sets the user and its primary group but leaves the supplementary groups as they were,
root's: :func:`preexec` sets the learner's own (and the task cap ``RLIMIT_NPROC``, as on the other path)
before ``systemd-run`` runs. A learner's previous scope, and whatever is left in it, is stopped before their
server starts again (:func:`end`), so that a restart never gives a learner a second set of limits.

:func:`probe` tries the limits before the workshop starts: a short scope as root, its properties read back
with ``systemctl show``, the kernel's files of its group read back, and its process seen in the group.
"""

from __future__ import annotations

import os
import pwd
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from labkit.workshop import limits as cgroups
from labkit.workshop.limits import Limits

RUNTIME = Path("/run/systemd/system")  # exists when systemd is PID 1 (sd_booted)
UNIT = "labkit-workshop-{}.scope"
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # a Unix user name that is also safe in a unit name
SHOWN = ("ActiveState", "ControlGroup", "CPUQuotaPerSecUSec", "MemoryMax", "TasksMax")
TIMESPAN = re.compile(r"(\d+(?:\.\d+)?)(min|ms|us|µs|s)")


def available() -> bool:
    """Is systemd PID 1 here, with ``systemd-run`` and ``systemctl`` to ask it for scopes?"""
    return RUNTIME.is_dir() and shutil.which("systemd-run") is not None and shutil.which("systemctl") is not None


def unit(learner: str) -> str:
    if not NAME.fullmatch(learner):
        raise ValueError(f"{learner!r} is not a user name labkit makes a scope for")
    return UNIT.format(learner)


def percent(cores: float) -> str:
    """``CPUQuota`` for ``cores``: ``150%`` for 1.5 (systemd takes up to two decimals of a percent)."""
    return f"{cores * 100:.2f}".rstrip("0").rstrip(".") + "%"


def properties(asked: Limits) -> list[str]:
    """The scope's limit properties, each as ``-p NAME=VALUE``."""
    props = [*([f"CPUQuota={percent(asked.cores)}"] if asked.cores else []),
             *([f"MemoryMax={asked.memory}"] if asked.memory else []),
             *([f"TasksMax={asked.pids}"] if asked.pids else [])]
    return [arg for p in props for arg in ("-p", p)]


def argv(learner: str, asked: Limits, *, as_learner: bool = True) -> list[str]:
    """The ``systemd-run`` prefix that runs a command as ``learner`` in their scope with ``asked``'s limits
    (``as_learner=False``: as the caller, for :func:`probe`). Reads nothing: the same arguments give the same
    command."""
    return ["systemd-run", "--scope", "--quiet", "--collect", f"--unit={unit(learner)}",
            f"--description=labkit workshop: {learner}'s server", *([f"--uid={learner}"] if as_learner else []),
            *properties(asked), "--"]


def preexec(learner: str, asked: Limits) -> Callable[[], None]:
    """A ``preexec_fn`` for ``systemd-run`` (still root): the learner's supplementary groups, which
    ``systemd-run --uid`` does not set, the task cap, and the learner's home as the working folder."""
    info = pwd.getpwnam(learner)
    groups = os.getgrouplist(learner, info.pw_gid)

    def run() -> None:
        os.setgroups(groups)
        if asked.pids:
            resource.setrlimit(resource.RLIMIT_NPROC, (asked.pids, asked.pids))
        try:
            os.chdir(info.pw_dir)
        except OSError:
            os.chdir("/")

    return run


def end(learner: str) -> None:
    """Stop ``learner``'s scope, if one is left from their previous server (its processes are ended)."""
    subprocess.run(["systemctl", "stop", unit(learner)], capture_output=True, timeout=60, check=False)


def kill(learner: str) -> None:
    """End everything in ``learner``'s scope at once (SIGKILL to every process systemd finds in its group, not the
    SIGTERM of a stop and its timeout), then stop the scope. Nothing to do when there is no scope."""
    subprocess.run(["systemctl", "kill", "--signal=SIGKILL", unit(learner)], capture_output=True, timeout=60,
                   check=False)
    end(learner)


def show(name: str) -> dict[str, str]:
    """``systemctl show``'s :data:`SHOWN` properties of the unit ``name``."""
    out = subprocess.run(["systemctl", "show", *(f"--property={p}" for p in SHOWN), name],
                         capture_output=True, text=True, timeout=30, check=False)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def seconds(span: str) -> float | None:
    """A systemd time span (``1.500000s``, ``1s 500ms``, ``150ms``) in seconds; None for ``infinity``."""
    parts = TIMESPAN.findall(span.replace(" ", ""))
    if not parts or "".join(n + u for n, u in parts) != span.replace(" ", ""):
        return None
    scale = {"min": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def mismatches(shown: dict[str, str], asked: Limits) -> list[str]:
    """What of ``asked`` the scope's properties (``systemctl show``) do not hold."""
    wrong = []
    if asked.cores:
        got = seconds(shown.get("CPUQuotaPerSecUSec", ""))
        if got is None or abs(got - asked.cores) > 1e-4:
            wrong.append(f"CPUQuotaPerSecUSec is {shown.get('CPUQuotaPerSecUSec')!r}, not {asked.cores:g} s")
    if asked.memory and shown.get("MemoryMax") != str(asked.memory):
        wrong.append(f"MemoryMax is {shown.get('MemoryMax')!r}, not {asked.memory}")
    if asked.pids and shown.get("TasksMax") != str(asked.pids):
        wrong.append(f"TasksMax is {shown.get('TasksMax')!r}, not {asked.pids}")
    return wrong


def quota(text: str, period: str | None = None) -> float | None:
    """Cores of a kernel CPU quota: ``cpu.max`` (``"150000 100000"``) or v1's ``cfs_quota_us`` and
    ``cfs_period_us``; None when unlimited (``max``, ``-1``) or unreadable."""
    q, _, p = text.strip().partition(" ")
    p = period.strip() if period is not None else p
    try:
        return int(q) / int(p) if int(q) > 0 and int(p) > 0 else None
    except ValueError:
        return None


def _kernel(group: str, asked: Limits) -> list[str]:
    """What of ``asked`` the kernel's files of the scope's group (``ControlGroup``) do not hold. The CPU quota
    to systemd's precision (a hundredth of a percent), memory to the page (:func:`limits.read_back`)."""
    rel = group.lstrip("/")
    rest = Limits(None, asked.memory, asked.pids)
    v2 = (cgroups.CGROUP / "cgroup.controllers").is_file()
    wrong = []
    for kind in asked.asked():
        folder = cgroups.CGROUP / rel if v2 else cgroups.CGROUP / kind / rel
        if not folder.is_dir():
            wrong.append(f"systemd made no {kind} group for the scope ({folder} is missing)")
        elif kind == "cpu":
            got = (quota((folder / "cpu.max").read_text()) if v2 else
                   quota((folder / "cpu.cfs_quota_us").read_text(), (folder / "cpu.cfs_period_us").read_text()))
            if got is None or abs(got - asked.cores) > 1e-4 + 1e-9:
                wrong.append(f"the scope's CPU quota in the kernel is {got} cores, not {asked.cores:g}")
    if v2 and (cgroups.CGROUP / rel).is_dir():
        wrong += cgroups.read_back(cgroups.CGROUP / rel, "v2", rest)
        enabled = (cgroups.CGROUP / rel / "cgroup.controllers").read_text().split()
        wrong += [] if not asked.cores or "cpu" in enabled else ["the cpu controller is not enabled for the scope"]
    elif not v2:
        for kind in rest.asked():
            if (cgroups.CGROUP / kind / rel).is_dir():
                wrong += cgroups.read_back(cgroups.CGROUP / kind / rel, kind, rest)
    return wrong


def probe(asked: Limits, wait: float = 15.0) -> str | None:
    """None when a scope with ``asked``'s limits can be started here and holds them, else why not."""
    if not asked.asked():
        return None
    if not available():
        return "systemd is not PID 1 here, or systemd-run is missing"
    learner = f"probe-{os.getpid()}"
    name = unit(learner)
    child = subprocess.Popen([*argv(learner, asked, as_learner=False), "sleep", "60"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + wait
        shown = show(name)
        while shown.get("ActiveState") != "active" or not shown.get("ControlGroup"):
            if child.poll() is not None:
                return f"systemd-run could not start a scope with these limits ({child.stderr.read().strip()})"
            if time.monotonic() > deadline:
                return f"the scope {name} did not start within {wait:g} s"
            time.sleep(0.05)
            shown = show(name)
        wrong = mismatches(shown, asked) + _kernel(shown["ControlGroup"], asked)
        lines = Path(f"/proc/{child.pid}/cgroup").read_text().splitlines()
        if not any(line.endswith(":" + shown["ControlGroup"]) for line in lines):
            wrong.append(f"the scope's process is not in its group {shown['ControlGroup']}")
        return "; ".join(wrong) or None
    except OSError as e:
        return f"the scope's limits could not be read back ({e})"
    finally:  # reaped first: a zombie child would keep the scope from stopping until systemd's stop timeout
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stderr:
            child.stderr.close()
        subprocess.run(["systemctl", "stop", name], capture_output=True, timeout=60, check=False)
