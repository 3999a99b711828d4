"""Run a tf.distribute cluster of local processes from a cell or a shell, and tear it down.

Every task (chief, workers, parameter servers) runs the same command with its
own ``TF_CONFIG``, in its own session, with ``LABKIT_JOB_ID`` in its
environment so that :func:`labkit.launch.kill_job` finds everything it started.
The leading task's output (the chief, else worker 0) is streamed live; every
task is logged to ``LOG_DIR/<type>.<index>.log``.

    >>> result = run(["python", "train.py", "--epochs", "2"], workers=2)   # doctest: +SKIP

For the fault-tolerance demo, :class:`Cluster` kills and restarts single tasks::

    with Cluster(cmd, workers=2) as c:
        c.start()
        c.wait_for_output(r"Epoch 2/", timeout=120)
        c.kill_task("worker", 1)
        c.restart_dead()
        result = c.wait(timeout=300)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from labkit import jobrecord, launch, observe, runs, tfconfig
from labkit.rank import die_with_parent

TaskId = tuple[str, int]


@dataclass
class Task:
    """One process of the cluster (its current incarnation)."""

    type: str
    index: int
    log: Path
    cwd: Path | None = None
    proc: subprocess.Popen | None = None
    starts: int = 0
    killed: bool = False  # by kill_task, on purpose
    returncode: int | None = None
    pump: threading.Thread | None = None

    @property
    def name(self) -> str:
        return f"{self.type}.{self.index}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class ClusterResult:
    """What a cluster run did."""

    returncodes: dict[str, int | None]
    log_dir: Path
    duration: float
    timed_out: bool = False
    interrupted: bool = False
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.interrupted and not self.errors

    def log(self, task: str = "worker.0") -> str:
        path = self.log_dir / f"{task}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summary(self) -> str:
        if self.ok:
            n = len(self.returncodes)
            return f"cluster finished OK in {self.duration:.1f} s ({n} tasks); logs in {self.log_dir}"
        why = (
            f"timed out after {self.duration:.0f} s" if self.timed_out
            else "interrupted" if self.interrupted else "failed"
        )
        lines = [f"cluster {why}; logs in {self.log_dir}"]
        for name, err in sorted(self.errors.items()):
            lines += [f"--- {name} (exit {self.returncodes.get(name)}) ---", err]
        return "\n".join(lines)


class Cluster:
    """The processes of one tf.distribute cluster on this machine.

    ``command`` runs once per task with ``TF_CONFIG`` set. ``cluster`` is a spec
    from :func:`labkit.tfconfig.cluster_spec` (default: ``workers`` workers,
    ``ps`` parameter servers, an optional chief, on free local ports). The run
    ends when every *leading* task has exited: all workers (and the chief) for
    all-reduce strategies; only the chief when there are parameter servers
    (workers and servers then serve forever and are stopped).
    """

    def __init__(
        self,
        command: Sequence[str] | str,
        workers: int = 2,
        ps: int = 0,
        chief: bool = False,
        cluster: dict[str, list[str]] | None = None,
        threads: int | None = None,
        env: dict[str, str] | None = None,
        log_dir: str | Path | None = None,
        cwd: str | Path | None = None,
        task_cwd: Callable[[str, int], str | Path | None] | None = None,
        sink: launch.ConsoleSink | launch.NotebookSink | None = None,
        quiet: bool = False,
        show: TaskId | None = None,
        record: bool = True,
        target: float | None = None,
        independent: bool = False,
    ) -> None:
        if isinstance(command, str):
            command = shlex.split(command)
        if not command:
            raise launch.LaunchError("nothing to run: give a command, e.g. ['python', 'train.py']")
        self.command = [sys.executable if c in ("python", "python3") else c for c in command]
        self.spec = tfconfig.validate(cluster) if cluster else tfconfig.cluster_spec(workers, ps, chief)
        self.job_id = uuid.uuid4().hex
        self.log_dir = Path(log_dir) if log_dir else launch.new_log_dir(Path(cwd or ".") / "runs" / "logs")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.log_dir.resolve()
        n = len(tfconfig.tasks(self.spec))
        # Parameter servers mostly wait: give the cores to the chief and workers.
        busy = n - len(self.spec.get("ps", []))
        self.env = launch.worker_env(max(1, busy), threads)
        if "ps" in self.spec:
            # With one inter-op thread, remote steps sent by the coordinator can deadlock on a worker.
            self.env["TF_NUM_INTEROP_THREADS"] = str(max(2, int(self.env["TF_NUM_INTEROP_THREADS"])))
        self.env.update(env or {})
        self.env[launch.JOB_VAR] = self.job_id
        self.env["PYTHONUNBUFFERED"] = "1"
        # independent: the same command N times without TF_CONFIG, i.e. N single-worker copies
        # (the ceiling a machine gives N workers when they do not communicate).
        self.independent = independent
        self.record, self.target = record, target
        self.records = (Path(cwd or ".") / (self.env.get(runs.FILE_VAR) or runs.runs_file())).resolve()
        self.env.setdefault(runs.RUN_ID_VAR, runs.new_run_id())
        self.env.setdefault(runs.LAUNCHER_VAR, "independent" if independent else "cluster")
        if record:
            self.env[observe.OBSERVE_VAR] = str(self.log_dir / "observed")
            self.env[runs.FILE_VAR] = str(self.records)
        self.cwd = cwd
        self.show = show or tfconfig.chief_task(self.spec)
        self.sink = None if quiet else (sink or launch.default_sink())
        self.tasks: dict[TaskId, Task] = {}
        if independent and task_cwd is None:
            # Copies must not share what a script writes relative to its folder (backups, logs, models).
            def task_cwd(t: str, i: int) -> Path:
                return self.log_dir / f"copy.{i}"
        for t, i in tfconfig.tasks(self.spec):
            where = task_cwd(t, i) if task_cwd else None
            self.tasks[(t, i)] = Task(t, i, self.log_dir / f"{t}.{i}.log", Path(where) if where else None)
        ps_run = "ps" in self.spec
        self.leading = [k for k in self.tasks if k[0] == "chief"] if ps_run and "chief" in self.spec else [
            k for k in self.tasks if k[0] in ("chief", "worker")
        ]
        self.start_time: float | None = None
        self.start_wall: float | None = None
        (self.log_dir / "command.txt").write_text(shlex.join(self.command) + "\n")
        (self.log_dir / "cluster.json").write_text(tfconfig.tf_config(self.spec, *self.show) + "\n")

    # -- processes -----------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start every task (servers first, so that the others find them)."""
        self.start_time = time.perf_counter()
        self.start_wall = time.time()
        order = sorted(self.tasks, key=lambda k: {"ps": 0, "worker": 1, "chief": 2}.get(k[0], 3))
        for key in order:
            self.start_task(*key)
        return self

    def start_task(self, task_type: str, index: int) -> Task:
        """Start (or start again) one task; its log is appended to."""
        task = self.tasks[(task_type, index)]
        if task.alive():
            raise launch.LaunchError(f"{task.name} is already running")
        env = {**os.environ, **self.env, "LABKIT_TASK": task.name}
        if self.independent:
            env.pop("TF_CONFIG", None)
        else:
            env["TF_CONFIG"] = tfconfig.tf_config(self.spec, task_type, index)
        cwd = task.cwd or self.cwd
        if cwd:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        task.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True, preexec_fn=die_with_parent,
        )
        task.starts += 1
        task.killed = False
        task.returncode = None
        show = (task_type, index) == self.show and self.sink is not None
        task.pump = threading.Thread(target=self._pump, args=(task, show), daemon=True)
        task.pump.start()
        return task

    def _pump(self, task: Task, show: bool) -> None:
        proc = task.proc
        assert proc is not None and proc.stdout is not None
        renderer = launch.Renderer(self.sink.line, self.sink.progress) if show and self.sink else None
        with open(task.log, "ab", buffering=0) as log:
            if task.starts > 1:
                log.write(f"\n--- {task.name} restarted (start {task.starts}) ---\n".encode())
                if renderer:
                    renderer.on_line(f"--- {task.name} restarted ---")
            fd = proc.stdout.fileno()
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                log.write(chunk)
                if renderer:
                    renderer.feed(chunk)
        if renderer:
            renderer.close()

    def kill_task(self, task_type: str, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one task (SIGKILL by default, like a machine that disappears)."""
        task = self.tasks[(task_type, index)]
        if task.proc is None:
            return
        task.killed = True
        try:
            os.killpg(task.proc.pid, sig)
        except ProcessLookupError:
            pass
        task.returncode = task.proc.wait()
        if task.pump:
            task.pump.join(5)

    def restart_task(self, task_type: str, index: int) -> Task:
        """Kill the task if it still runs, then start it again with the same TF_CONFIG."""
        if self.tasks[(task_type, index)].alive():
            self.kill_task(task_type, index)
        return self.start_task(task_type, index)

    def restart_dead(self, settle: float = 0.0) -> list[str]:
        """Start again every task that is not running (after a kill, the peers often exit too)."""
        time.sleep(settle)
        dead = [k for k, t in self.tasks.items() if not t.alive()]
        for key in dead:
            self.start_task(*key)
        return [self.tasks[k].name for k in dead]

    def alive(self) -> list[str]:
        return [t.name for t in self.tasks.values() if t.alive()]

    def output(self, task_type: str | None = None, index: int | None = None) -> str:
        """Everything a task printed so far (default: the shown task)."""
        key = (task_type, index) if task_type is not None else self.show
        path = self.tasks[(key[0], key[1] if key[1] is not None else 0)].log
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_output(
        self, pattern: str, task_type: str | None = None, index: int | None = None,
        timeout: float = 300, count: int = 1,
    ) -> re.Match:
        """Block until ``pattern`` appears ``count`` times in a task's output; raise on exit or timeout."""
        rx = re.compile(pattern)
        key = (task_type, index or 0) if task_type is not None else self.show
        deadline = time.monotonic() + timeout
        while True:
            found = list(rx.finditer(self.output(*key)))
            if len(found) >= count:
                return found[count - 1]
            if not self.tasks[key].alive():
                raise launch.LaunchError(f"{key[0]}.{key[1]} exited before printing {pattern!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{key[0]}.{key[1]} did not print {pattern!r} within {timeout:.0f} s")
            time.sleep(0.2)

    def wait(self, timeout: float | None = None) -> ClusterResult:
        """Wait until the leading tasks exit (or one task fails), then stop everything."""
        deadline = None if timeout is None else time.monotonic() + timeout
        timed_out = interrupted = False
        try:
            while True:
                failed = [
                    t for t in self.tasks.values()
                    if t.proc is not None and not t.killed and t.proc.poll() not in (None, 0)
                ]
                if failed or all(not self.tasks[k].alive() for k in self.leading):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            self.stop()
        result = self._result(timed_out, interrupted)
        if self.record:
            self._write_record(result)
        if self.sink and not result.ok:
            for line in result.summary().splitlines():
                self.sink.line(line)
        if interrupted:
            raise KeyboardInterrupt(result.summary())
        return result

    def _write_record(self, result: ClusterResult) -> None:
        status = "ok" if result.ok else "timeout" if result.timed_out else (
            "interrupted" if result.interrupted else "failed")
        code = 0 if result.ok else next((c for c in result.returncodes.values() if c), 1)
        workers = len(self.spec.get("worker", [])) + len(self.spec.get("chief", []))
        jobrecord.finish(
            self.env[runs.RUN_ID_VAR], self.log_dir / "observed", command=self.command,
            launcher=self.env[runs.LAUNCHER_VAR], workers=workers, threads=int(self.env.get("LABKIT_THREADS", 0))
            or None, start=self.start_wall or time.time(), duration=result.duration, exit_status=code or 0,
            status=status, error=next(iter(result.errors.values()), None), log_dir=self.log_dir,
            target=self.target, path=self.records, copies=self.independent, bench=self.env.get("LABKIT_BENCH"),
            tasks={t: len(v) for t, v in self.spec.items()},
        )

    def _result(self, timed_out: bool, interrupted: bool) -> ClusterResult:
        codes: dict[str, int | None] = {}
        errors: dict[str, str] = {}
        for key, t in self.tasks.items():
            code = t.returncode if t.returncode is not None else (t.proc.returncode if t.proc else None)
            codes[t.name] = code
            leading_ok = key not in self.leading or code == 0
            if not leading_ok or (key not in self.leading and code not in (0, None, -signal.SIGTERM,
                                                                             -signal.SIGKILL) and not t.killed):
                errors[t.name] = launch._error_tail(t.log.read_text(errors="replace") if t.log.exists() else "")
        duration = time.perf_counter() - (self.start_time or time.perf_counter())
        return ClusterResult(codes, self.log_dir, duration, timed_out, interrupted, errors)

    def stop(self, grace: float = 3.0) -> None:
        """Stop every task of the cluster and anything they started; wait for the output threads."""
        for key, t in self.tasks.items():
            if t.alive():
                t.killed = t.killed or key not in self.leading  # servers are stopped on purpose
                try:
                    os.killpg(t.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
                except ProcessLookupError:
                    pass
        end = time.monotonic() + grace
        for t in self.tasks.values():
            if t.proc is not None:
                try:
                    t.proc.wait(max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        launch.kill_job(None, self.job_id)
        for t in self.tasks.values():
            if t.proc is not None:
                if t.proc.poll() is None:
                    try:
                        os.killpg(t.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                t.proc.wait()
                if t.returncode is None:
                    t.returncode = t.proc.returncode
            if t.pump:
                t.pump.join(5)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run(
    command: Sequence[str] | str,
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    hosts: Sequence[str] | None = None,
    timeout: float | None = None,
    **kw: object,
) -> ClusterResult:
    """Start a local cluster running ``command`` on every task, wait, and clean up."""
    spec = tfconfig.cluster_spec(workers, ps, chief, hosts=hosts) if hosts else None
    c = Cluster(command, workers=workers, ps=ps, chief=chief, cluster=spec, **kw)  # type: ignore[arg-type]
    try:
        c.start()
        return c.wait(timeout)
    finally:
        c.stop()


# ----------------------------------------------------------------------------- CLI


def add_cli(sub) -> None:  # noqa: ANN001
    """Register ``labkit cluster``."""
    p = sub.add_parser(
        "cluster", help="run a command as every task of a local tf.distribute cluster",
        description="Example: labkit cluster --workers 2 -- python fashion_mnist_multiworker.py --epochs 2",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--workers", type=int, default=2, help="number of workers")
    p.add_argument("--ps", type=int, default=0, help="number of parameter servers")
    p.add_argument("--chief", action="store_true", help="add a chief task (needed with --ps)")
    p.add_argument("--hosts", default=None, help="comma-separated host:port per task, in order chief, workers, ps")
    p.add_argument("--threads", type=int, default=None, help="threads per task (default: cores // tasks)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before every task is killed")
    p.add_argument("--log-dir", default=None, help="folder for <type>.<index>.log (default: runs/logs/<time>)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    p.set_defaults(func=_cli)


def _cli(a) -> int:  # noqa: ANN001
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        hosts = a.hosts.split(",") if a.hosts else None
        result = run(command, workers=a.workers, ps=a.ps, chief=a.chief, hosts=hosts, timeout=a.timeout,
                     threads=a.threads, log_dir=a.log_dir)
    except (launch.LaunchError, tfconfig.ClusterError) as e:
        print(f"labkit cluster: {e}", file=sys.stderr)
        return 2
    print(result.summary(), file=sys.stderr)
    return 0 if result.ok else (124 if result.timed_out else 1)


# ----------------------------------------------------------------------------- fault tolerance


@dataclass
class ResumeReport:
    """What happened around a worker kill: epochs begun before and after the restart."""

    killed: str
    before: list[int]  # epochs (1-based) the chief began before the kill
    after: list[int]  # epochs it began after the restart
    result: ClusterResult | None = None
    job_id: str = ""

    @property
    def completed_before(self) -> list[int]:
        """Epochs finished before the kill (all begun ones but the last, which was cut)."""
        return self.before[:-1]

    @property
    def repeated(self) -> list[int]:
        return sorted(set(self.completed_before) & set(self.after))

    @property
    def ok(self) -> bool:
        return bool(self.after) and not self.repeated and self.result is not None and self.result.ok

    def __str__(self) -> str:
        lines = [
            f"killed {self.killed} during epoch {self.before[-1] if self.before else '?'}",
            f"epochs completed before the kill: {self.completed_before}",
            f"epochs run after the restart:     {self.after}",
        ]
        if self.repeated:
            lines.append(f"REPEATED after the restart: {self.repeated} (no BackupAndRestore?)")
        elif self.after:
            lines.append("nothing repeated: training resumed from the last backup")
        if self.result is not None:
            lines.append(self.result.summary().splitlines()[0])
        return "\n".join(lines)


EPOCH_LINE = re.compile(r"^Epoch (\d+)/\d+", re.M)


def kill_and_resume(
    command: Sequence[str] | str,
    workers: int = 2,
    kill: TaskId = ("worker", 1),
    kill_in_epoch: int = 2,
    timeout: float = 600,
    settle: float = 30,
    **kw: object,
) -> ResumeReport:
    """Start a cluster, kill one task once the chief begins epoch ``kill_in_epoch``, restart, and report.

    When a worker of a MultiWorkerMirroredStrategy cluster dies, its peers' next
    collective fails and they exit too; every task that died is started again
    with its old TF_CONFIG, as a cluster manager would.
    """
    c = Cluster(command, workers=workers, **kw)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    with c:
        c.start()
        c.wait_for_output(rf"(?m)^Epoch {kill_in_epoch}/", timeout=max(1.0, deadline - time.monotonic()))
        before_text = c.output()
        c.kill_task(*kill)
        if c.sink:
            c.sink.line(f"*** killed {kill[0]}.{kill[1]} (SIGKILL) ***")
        end = time.monotonic() + settle
        while time.monotonic() < end and any(c.tasks[k].alive() for k in c.leading if k != kill):
            time.sleep(0.2)
        restarted = c.restart_dead()
        if c.sink:
            c.sink.line(f"*** restarted {', '.join(restarted)} ***")
        result = c.wait(max(1.0, deadline - time.monotonic()))
    after_text = c.output()[len(before_text):]
    marker = after_text.find("restarted (start")
    after_text = after_text[marker:] if marker >= 0 else after_text
    before = [int(m) for m in EPOCH_LINE.findall(before_text)]
    after = [int(m) for m in EPOCH_LINE.findall(after_text)]
    return ResumeReport(f"{kill[0]}.{kill[1]}", sorted(dict.fromkeys(before)), sorted(dict.fromkeys(after)), result,
                        c.job_id)
