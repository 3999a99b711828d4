"""Launch multi-process jobs (mpirun, horovodrun, horovodrun --gloo) from a cell or the CLI.

Command builders return argument lists and can be tested without MPI. :func:`run`
starts the job in its own session, streams rank 0's output live (Keras progress
bars rendered as one updating line), logs every rank to ``LOG_DIR/rank.N.log``,
and on exit, error, timeout or interrupt kills every process the job started.

CPU defaults (see :func:`worker_env`): each worker gets ``cores // np`` threads for
TensorFlow, OpenMP and BLAS, Horovod's CPU allreduce runs over Gloo (its TCP
transport blocks instead of spinning, so a worker waiting for its peer does not
steal the peer's core), and OpenMPI is told to yield when idle.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from labkit import env as lkenv
from labkit import jobrecord, observe, runs
from labkit.rank import die_with_parent

LAUNCHERS = ("mpirun", "horovodrun", "gloo")
JOB_VAR = "LABKIT_JOB_ID"
TAG = re.compile(rb"\[\d+(?:,\d+)?\]<std(?:out|err)>:")  # horovodrun's per-line rank tags


class LaunchError(RuntimeError):
    """The job cannot be started; the message says how to fix it."""


def cpu_count() -> int:
    """Cores this process may use (affinity aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads(np: int, cores: int | None = None) -> int:
    """Threads per worker so that all workers together use each core once."""
    if np < 1:
        raise ValueError(f"need at least one worker, got np={np}")
    return max(1, (cores or cpu_count()) // np)


def gpu_count() -> int:
    """NVIDIA GPUs on this machine, from ``nvidia-smi -L`` (no TensorFlow import)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def worker_env(np: int, threads: int | None = None, gpus: int | None = None) -> dict[str, str]:
    """Environment each worker gets on top of the caller's (documented in the README)."""
    threads = threads or default_threads(np)
    env = dict(lkenv.DEFAULTS)
    env.update(lkenv.thread_env(threads))
    env["LABKIT_THREADS"] = str(threads)
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"  # MPI waits yield the core instead of spinning
    if gpus is None:
        gpus = gpu_count()
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no CUDA probing on CPU-only machines
    return env


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def mpirun_flags(
    np: int, hosts: str | None = None, cores: int | None = None, as_root: bool | None = None
) -> list[str]:
    """The options labkit gives ``mpirun`` (also used for ipyparallel MPI engines)."""
    if np < 1:
        raise ValueError(f"need at least one worker, got np={np}")
    args = []
    if as_root if as_root is not None else _is_root():
        args.append("--allow-run-as-root")
    if hosts:
        args += ["-H", hosts]
    elif np > (cores or cpu_count()):
        args.append("--oversubscribe")
    # Threads are limited per worker through env; binding to one core would starve
    # multi-threaded workers, so let the kernel place them.
    args += ["--bind-to", "none", "--map-by", "slot"]
    # Shared memory within a node, TCP across nodes; no InfiniBand probing noise.
    args += ["--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none"]
    return args


def mpirun_command(
    command: Sequence[str],
    np: int,
    env: dict[str, str],
    hosts: str | None = None,
    cores: int | None = None,
    as_root: bool | None = None,
    mpirun: str = "mpirun",
) -> list[str]:
    """``mpirun`` arguments for ``command`` on ``np`` ranks, exporting ``env``'s names."""
    args = [mpirun, "-np", str(np), *mpirun_flags(np, hosts, cores, as_root)]
    for name in sorted(env):
        args += ["-x", name]
    return args + list(command)


def horovodrun_command(
    command: Sequence[str], np: int, hosts: str | None = None, gloo: bool = False, horovodrun: str = "horovodrun"
) -> list[str]:
    """``horovodrun`` arguments (``gloo=True`` launches without MPI)."""
    if np < 1:
        raise ValueError(f"need at least one worker, got np={np}")
    args = [horovodrun, "-np", str(np), "-H", hosts or f"localhost:{np}"]
    args.append("--gloo" if gloo else "--mpi")
    return args + list(command)


def build_command(
    command: Sequence[str],
    np: int,
    launcher: str = "mpirun",
    env: dict[str, str] | None = None,
    log_dir: str | Path = "runs/logs",
    hosts: str | None = None,
) -> list[str]:
    """The full launch command: launcher + per-rank log wrapper + ``command``."""
    if launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    if not command:
        raise LaunchError("nothing to run: give a command, e.g. ['python', 'train.py']")
    command = [sys.executable if c in ("python", "python3") else c for c in command]
    wrapped = [sys.executable, "-m", "labkit.rank", str(log_dir), "--", *command]
    if launcher == "mpirun":
        return mpirun_command(wrapped, np, env or {}, hosts=hosts, mpirun=_tool("mpirun"))
    return horovodrun_command(wrapped, np, hosts=hosts, gloo=launcher == "gloo", horovodrun=_tool("horovodrun"))


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def preflight(launcher: str) -> None:
    """Raise :class:`LaunchError` with a fix when the launcher or Horovod cannot work."""
    if launcher in ("mpirun", "horovodrun") and not shutil.which("mpirun"):
        raise LaunchError(
            "mpirun was not found. Install OpenMPI: `sudo apt-get install openmpi-bin libopenmpi-dev` "
            "(or run `make setup`), or use launcher='gloo'."
        )
    if launcher in ("horovodrun", "gloo") and not Path(_tool("horovodrun")).exists() and not shutil.which("horovodrun"):
        raise LaunchError("horovodrun was not found: Horovod is not installed in this environment; run `make setup`.")
    problem = lkenv.keras_problem()
    if problem:
        raise LaunchError(problem)


# ----------------------------------------------------------------------------- output


class Renderer:
    """Turns a byte stream with ``\\r``/``\\b`` progress updates into lines and progress.

    ``on_line(text)`` gets each finished line, ``on_progress(text)`` the current
    state of a line being redrawn (a Keras progress bar).
    """

    def __init__(self, on_line: Callable[[str], None], on_progress: Callable[[str], None] | None = None) -> None:
        self.on_line = on_line
        self.on_progress = on_progress
        self.current: list[str] = []
        self.rewind = False
        self._pending = b""
        self._shown = ""

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        try:
            text = data.decode("utf-8")
            self._pending = b""
        except UnicodeDecodeError as e:  # a multi-byte character split across chunks
            text, self._pending = data[: e.start].decode("utf-8"), data[e.start :]
        prev, erased = "", False
        for ch in text:
            if ch == "\n":
                self.on_line("".join(self.current))
                self.current, self.rewind, self._shown = [], False, ""
            elif ch == "\r":
                self.rewind = True
            elif ch == "\b":
                if prev != "\b":
                    self._show()  # the line is about to be erased and redrawn: show its last state
                erased = True
                if self.current:
                    self.current.pop()
            else:
                if self.rewind:
                    if prev != "\r" or not erased:
                        self._show()
                    self.current, self.rewind = [], False
                self.current.append(ch)
            if ch not in "\b\r":
                erased = False
            prev = ch
        if prev != "\b":
            self._show()

    def _show(self) -> None:
        text = "".join(self.current)
        if text and text != self._shown and self.on_progress:
            self.on_progress(text)
        self._shown = text

    def close(self) -> None:
        if self.current:
            self.on_line("".join(self.current))
            self.current = []


class ConsoleSink:
    """Lines to a stream; progress as one redrawn line on a terminal, dropped elsewhere."""

    def __init__(self, stream=None) -> None:  # noqa: ANN001
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.width = 0

    def line(self, text: str) -> None:
        if lkenv.is_noise(text):
            return
        pad = " " * max(0, self.width - len(text)) if self.tty else ""
        self.stream.write(("\r" if self.width else "") + text + pad + "\n")
        self.stream.flush()
        self.width = 0

    def progress(self, text: str) -> None:
        if not self.tty:
            return
        self.stream.write("\r" + text + " " * max(0, self.width - len(text)))
        self.stream.flush()
        self.width = len(text)


class NotebookSink:
    """Lines printed into the cell; progress in one display that updates in place."""

    def __init__(self) -> None:
        from IPython.display import display

        self._display = display
        self.handle = None

    def line(self, text: str) -> None:
        if lkenv.is_noise(text):
            return
        if self.handle is not None:  # the finished progress bar stays where it was drawn
            self.handle.update(_Plain(text))
            self.handle = None
        else:
            print(text, flush=True)

    def progress(self, text: str) -> None:
        if self.handle is None:
            self.handle = self._display(_Plain(text), display_id=True)
        else:
            self.handle.update(_Plain(text))


class _Plain:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def in_notebook() -> bool:
    """True inside a Jupyter kernel."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and hasattr(shell, "kernel")


def default_sink() -> ConsoleSink | NotebookSink:
    return NotebookSink() if in_notebook() else ConsoleSink()


# ----------------------------------------------------------------------------- processes


def job_processes(job_id: str) -> list[int]:
    """PIDs of live processes whose environment carries ``LABKIT_JOB_ID=job_id``."""
    marker = f"{JOB_VAR}={job_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_job(proc: subprocess.Popen | None, job_id: str, grace: float = 3.0) -> None:
    """Stop the launcher's process group, then SIGKILL anything of the job still alive."""
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    for _ in range(3):
        pids = job_processes(job_id)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@dataclass
class JobResult:
    """What a launched job did."""

    returncode: int
    command: list[str]
    log_dir: Path
    np: int
    duration: float
    timed_out: bool = False
    interrupted: bool = False
    rank_exit: dict[int, int] = field(default_factory=dict)
    rank_errors: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.interrupted

    def log(self, rank: int = 0) -> str:
        """The full output of one rank."""
        path = self.log_dir / f"rank.{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summary(self) -> str:
        if self.ok:
            return f"job finished OK in {self.duration:.1f} s ({self.np} workers); logs in {self.log_dir}"
        why = (
            f"timed out after {self.duration:.0f} s" if self.timed_out
            else "interrupted" if self.interrupted
            else f"failed with exit code {self.returncode}"
        )
        lines = [f"job {why}; logs in {self.log_dir}"]
        for rank, err in sorted(self.rank_errors.items()):
            lines.append(f"--- rank {rank} (exit {self.rank_exit.get(rank, '?')}) ---")
            lines.append(err)
        advice = dict.fromkeys(a for err in self.rank_errors.values() for a in hints(err))
        lines += [f"hint: {a}" for a in advice]
        return "\n".join(lines)


# Known failures deep inside a rank, and what to do about them.
HINTS: list[tuple[str, str]] = [
    ("No module named 'horovod'", "Horovod is not installed in this environment: run `make setup`."),
    ("Horovod has not been built with", "Horovod lacks this feature: rebuild it with `make setup` "
     "(it builds with TensorFlow, MPI and Gloo)."),
    ("was not built with MPI", "Horovod was built without MPI: use launcher='gloo' or rebuild with `make setup`."),
    ("was not built with Gloo", "Horovod was built without Gloo: use launcher='mpirun' or rebuild with `make setup`."),
    ("keras.src", "tf.keras looks like Keras 3 here; Horovod needs Keras 2: set TF_USE_LEGACY_KERAS=1 before "
     "TensorFlow is imported (`make setup` installs a start-up hook that does it)."),
    ("Fashion-MNIST was not found", "The data set is missing: run `make setup` or `labkit data`."),
    ("There are not enough slots available", "More workers than cores: labkit adds --oversubscribe only "
     "without -H; give each host enough slots, e.g. -H localhost:4."),
]


def hints(text: str) -> list[str]:
    """Advice for the known failures found in ``text``."""
    return [advice for marker, advice in HINTS if marker in text]


def _error_tail(text: str, lines: int = 15) -> str:
    """The end of a rank's log from its last traceback, or its last lines."""
    rows = [r for r in text.replace("\r", "\n").splitlines() if r.strip() and not lkenv.is_noise(r)]
    for i in range(len(rows) - 1, -1, -1):
        if rows[i].startswith("Traceback (most recent call last)"):
            tb = rows[i:]
            return "\n".join(tb[:3] + ["  ..."] + tb[-(lines - 4) :]) if len(tb) > lines else "\n".join(tb)
    return "\n".join(rows[-lines:])


def collect_rank_results(log_dir: Path, np: int) -> tuple[dict[int, int], dict[int, str]]:
    """Exit code and error text of each rank from the wrapper's files."""
    exits: dict[int, int] = {}
    errors: dict[int, str] = {}
    for rank in range(np):
        code_file = log_dir / f"rank.{rank}.exit"
        if code_file.exists():
            try:
                exits[rank] = int(code_file.read_text().strip())
            except ValueError:
                pass
        log = log_dir / f"rank.{rank}.log"
        if exits.get(rank, 1) != 0 and log.exists():
            errors[rank] = _error_tail(log.read_text(errors="replace"))
    return exits, errors


def new_log_dir(base: str | Path = "runs/logs") -> Path:
    """A fresh folder ``base/YYYYmmdd-HHMMSS-xxxx`` for one job's logs."""
    path = Path(base) / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run(
    command: Sequence[str] | str,
    np: int = 2,
    launcher: str = "mpirun",
    timeout: float | None = None,
    threads: int | None = None,
    hosts: str | None = None,
    log_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
    show_rank: int = 0,
    sink: ConsoleSink | NotebookSink | None = None,
    quiet: bool = False,
    cwd: str | Path | None = None,
    record: bool = True,
    target: float | None = None,
) -> JobResult:
    """Run ``command`` on ``np`` workers and wait; never leaves a process behind.

    ``command`` is a list (``["python", "train.py", "--epochs", "1"]``); a string
    is split like a shell would, but never run through a shell. With ``record``
    the processes are observed and the job's run record is appended when it ends
    (:mod:`labkit.jobrecord`); ``target`` is the validation accuracy its time to
    target is measured for (default: the script's ``--target-accuracy``).
    """
    import shlex

    if isinstance(command, str):
        command = shlex.split(command)
    preflight(launcher)
    job_id = uuid.uuid4().hex
    logs = Path(log_dir) if log_dir else new_log_dir(Path(cwd or ".") / "runs" / "logs")
    logs.mkdir(parents=True, exist_ok=True)
    logs = logs.resolve()
    wenv = worker_env(np, threads)
    if env:
        wenv.update(env)
    wenv[JOB_VAR] = job_id
    # Run records (labkit.runs): one id per job, the launcher's name, where the logs are.
    wenv.setdefault("LABKIT_RUN_ID", time.strftime("%Y%m%d-%H%M%S-") + job_id[:6])
    wenv.setdefault("LABKIT_LAUNCHER", launcher)
    wenv["LABKIT_LOG_DIR"] = str(logs)
    wenv["LABKIT_SHOW_RANK"] = str(show_rank)
    wenv["LABKIT_NP"] = str(np)
    records = (Path(cwd or ".") / (wenv.get(runs.FILE_VAR) or runs.runs_file())).resolve()
    if record:
        wenv[observe.OBSERVE_VAR] = str(logs / "observed")
        wenv[runs.FILE_VAR] = str(records)
    full = build_command(command, np, launcher, wenv, logs, hosts)
    (logs / "command.txt").write_text(" ".join(shlex.quote(c) for c in full) + "\n")
    sink = None if quiet else (sink or default_sink())
    renderer = Renderer(sink.line, sink.progress) if sink else None

    start = time.perf_counter()
    started = time.time()
    proc = subprocess.Popen(
        full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **wenv}, cwd=cwd, start_new_session=True,
        preexec_fn=die_with_parent,  # even if this process is killed outright, the job goes with it
    )
    timed_out = interrupted = False

    def pump() -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            if renderer:
                renderer.feed(TAG.sub(b"", chunk) if launcher != "mpirun" else chunk)
        if renderer:
            renderer.close()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except KeyboardInterrupt:
        interrupted = True
    finally:
        kill_job(proc, job_id)
        reader.join(5)
    duration = time.perf_counter() - start
    exits, errors = collect_rank_results(logs, np)
    code = proc.returncode if proc.returncode is not None else -1
    if timed_out or interrupted:
        code = code if code not in (0, None) else 124 if timed_out else 130
    result = JobResult(code, full, logs, np, duration, timed_out, interrupted, exits, errors)
    if record:
        status = "ok" if result.ok else "timeout" if timed_out else "interrupted" if interrupted else "failed"
        jobrecord.finish(
            wenv["LABKIT_RUN_ID"], logs / "observed", command=list(command), launcher=wenv["LABKIT_LAUNCHER"],
            workers=np, threads=int(wenv.get("LABKIT_THREADS", "0")) or None, start=started, duration=duration,
            exit_status=code, status=status, error=next(iter(errors.values()), None), log_dir=logs,
            target=target, path=records, bench=wenv.get("LABKIT_BENCH"),
        )
    if sink and not result.ok:
        for line in result.summary().splitlines():
            sink.line(line)
    if interrupted:
        raise KeyboardInterrupt(result.summary())
    return result


def add_cli(sub) -> None:  # noqa: ANN001
    """Register ``labkit run``."""
    p = sub.add_parser(
        "run", help="run a command on N workers",
        description="Run COMMAND on N workers, stream rank 0, log every rank. "
        "Example: labkit run --np 2 -- python train.py",
    )
    p.add_argument("--np", type=int, default=2, help="number of workers (default: %(default)s)")
    p.add_argument("--launcher", choices=LAUNCHERS, default="mpirun", help="default: %(default)s")
    p.add_argument("--timeout", type=float, default=None, help="seconds before every rank is killed")
    p.add_argument("--threads", type=int, default=None, help="threads per worker (default: cores // np)")
    p.add_argument("-H", "--hosts", default=None, help="host list, e.g. node1:2,node2:2")
    p.add_argument("--log-dir", default=None, help="folder for rank.N.log (default: runs/logs/<time>)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    p.set_defaults(func=_cli_run)


def _cli_run(a) -> int:  # noqa: ANN001
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        result = run(command, np=a.np, launcher=a.launcher, timeout=a.timeout, threads=a.threads,
                     hosts=a.hosts, log_dir=a.log_dir)
    except LaunchError as e:
        print(f"labkit run: {e}", file=sys.stderr)
        return 2
    if result.ok:
        print(result.summary(), file=sys.stderr)
    return result.returncode if not result.timed_out else 124
