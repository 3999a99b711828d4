"""The one process layer: start a job's processes, stream and log their output, stop them all.

Every process a :class:`Job` starts runs in its own session, with the job's id
in its environment (:data:`labkit.core.contract.JOB_ID`), so that whatever it starts
in turn (mpirun's daemons, Horovod's workers, ipyparallel engines) carries the
mark too. :meth:`Job.stop` ends the sessions it started, then kills every live
process that still carries the mark (psutil). A ``with Job() as job:`` block
stops everything on exit, error, timeout or interrupt; children also get
SIGKILL when the starting process dies outright (``PR_SET_PDEATHSIG``).

    with Job() as job:
        p = job.spawn(["python", "train.py"], log=Path("train.log"), on_output=print)
        code = p.wait(timeout=600)      # None on timeout; the block's exit stops the rest
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import psutil

from labkit.core import contract, orphans
from labkit.core.pipes import read_chunks


class Proc:
    """One started process (a session leader) and the thread that pumps its output."""

    def __init__(self, popen: subprocess.Popen, name: str, log: Path | None) -> None:
        self.popen = popen
        self.name = name
        self.log = log
        self.pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or ``None`` when still running after ``timeout`` seconds."""
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.drain()
        return code

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until all output has been read (after the process exited)."""
        if self.pump is not None:
            self.pump.join(timeout)

    def signal(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process's whole session (its process group)."""
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def output(self) -> str:
        """Everything logged so far."""
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""


def marked(job_id: str) -> list[psutil.Process]:
    """Live processes whose environment carries this job's mark (not this process)."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            env = p.environ()
            ours = env.get(contract.JOB_ID) == job_id or job_id in env.get(contract.JOB_IDS, "").split(":")
            if ours and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def kill_all(processes: Iterable[psutil.Process], sig: int = signal.SIGKILL) -> None:
    for p in processes:
        try:
            p.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


class Job:
    """The processes of one job: started marked, stopped together."""

    def __init__(self, job_id: str | None = None) -> None:
        self.id = job_id or uuid.uuid4().hex
        self.procs: list[Proc] = []
        self.left_behind: list[str] = []  # command lines found running after the process that started them ended

    def env(self, extra: Mapping[str, str | None] | None = None,
            base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) + ``extra`` (``None`` unsets) + the job's mark.

        A job started inside another job keeps the outer marks too, so stopping the outer job
        also finds what the inner one left behind.
        """
        merged: dict[str, str | None] = {**(os.environ if base is None else base), **(extra or {})}
        outer = [i for i in [*(merged.get(contract.JOB_IDS) or "").split(":"), merged.get(contract.JOB_ID)] if i]
        merged[contract.JOB_IDS] = ":".join(dict.fromkeys([*outer, self.id]))
        merged[contract.JOB_ID] = self.id
        return {k: v for k, v in merged.items() if v is not None}

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str | None] | None = None,
        cwd: str | Path | None = None,
        log: Path | None = None,
        on_output: Callable[[bytes], None] | None = None,
        on_end: Callable[[], None] | None = None,
        name: str = "",
        resume_log: bytes | None = None,
    ) -> Proc:
        """Start ``argv`` (a list, never a shell string) marked with this job's id.

        Output (stdout and stderr together) goes to ``log`` and to ``on_output`` as it
        arrives; ``on_end`` runs when the output ends. ``env`` is added to this process's
        environment. ``resume_log``: the log is appended to, after these bytes (a process started again),
        instead of replaced.
        """
        if isinstance(argv, str):
            raise TypeError("argv must be a list of arguments, not a shell string")
        if not argv:
            raise ValueError("nothing to run: empty argument list")
        if cwd:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        orphans.look_up()  # here, not in the forked child
        out = open(log, "wb" if resume_log is None else "ab", buffering=0) if log else None  # the pump closes it
        try:
            popen = subprocess.Popen(
                list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env(env), cwd=cwd, start_new_session=True, preexec_fn=orphans.die_with_parent,
            )
        except BaseException:
            if out:
                out.close()
            raise
        proc = Proc(popen, name or Path(argv[0]).name, log)
        proc.pump = threading.Thread(target=_pump, args=(popen, out, on_output, on_end, resume_log or b""), daemon=True)
        proc.pump.start()
        self.procs.append(proc)
        return proc

    def members(self) -> list[psutil.Process]:
        """Every live process of this job: the started ones, their descendants, and all marked ones."""
        seen: dict[int, psutil.Process] = {}
        for proc in self.procs:
            if proc.alive():
                try:
                    root = psutil.Process(proc.pid)
                    for p in [root, *root.children(recursive=True)]:
                        seen[p.pid] = p
                except psutil.NoSuchProcess:
                    pass
        for p in marked(self.id):
            seen[p.pid] = p
        return list(seen.values())

    def orphans(self) -> list[psutil.Process]:
        """Marked processes that no running started process accounts for: left behind by one that ended."""
        inside = {p.pid for p in self.procs}
        for proc in self.procs:
            if proc.alive():
                try:
                    inside.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
        return [p for p in marked(self.id) if p.pid not in inside]

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM every session started, wait up to ``grace`` s, then SIGKILL all that is left.

        What was left behind by a started process that had already ended is named in :attr:`left_behind`.
        """
        for p in self.orphans():
            try:
                self.left_behind.append(" ".join(p.cmdline()) or p.name())
            except psutil.Error:
                continue
        live = [p for p in self.procs if p.alive()]
        for p in live:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in live:
            p.wait(max(0.0, deadline - time.monotonic()))
        for _ in range(5):
            left = self.members()
            if not left:
                break
            for p in self.procs:
                if p.alive():
                    p.signal(signal.SIGKILL)
            kill_all(left)
            psutil.wait_procs(left, timeout=1.0)
        for p in self.procs:
            p.wait(5)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_marked(job_id: str, grace: float = 2.0) -> None:
    """Stop every process carrying ``job_id`` (for processes started by someone else, e.g. ipyparallel)."""
    left = marked(job_id)
    kill_all(left, signal.SIGTERM)
    _, alive = psutil.wait_procs(left, timeout=grace)
    for _ in range(3):
        alive = marked(job_id)
        if not alive:
            return
        kill_all(alive)
        psutil.wait_procs(alive, timeout=1.0)


def new_log_dir(base: str | Path = "runs/logs") -> Path:
    """A fresh folder ``base/YYYYmmdd-HHMMSS-xxxx`` for one job's logs."""
    path = Path(base) / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_until(check: Callable[[], bool], timeout: float | None, every: float = 0.2) -> bool:
    """Poll ``check`` until it is true (True) or ``timeout`` seconds pass (False)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not check():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def _pump(popen: subprocess.Popen, out: BinaryIO | None, on_output: Callable[[bytes], None] | None,
          on_end: Callable[[], None] | None, header: bytes) -> None:
    assert popen.stdout is not None
    fd = popen.stdout.fileno()
    try:
        if out and header:
            out.write(header)
        for chunk in read_chunks(fd):
            if out:
                out.write(chunk)
            if on_output:
                try:
                    on_output(chunk)
                except Exception:  # noqa: BLE001 - a display problem must not stop the logging
                    on_output = None
    finally:
        if out:
            out.close()
        popen.stdout.close()
        if on_end:
            try:
                on_end()
            except Exception:  # noqa: BLE001
                pass
