"""Run a tf.distribute cluster of local processes from a cell or a shell, and tear it down.

Every task (chief, workers, parameter servers) runs the same command with its
own ``TF_CONFIG``, started by the process layer (:mod:`labkit.core.proc`), which
stops everything the cluster started when it ends. Tasks placed on another host
(``host_list=``) start there over ssh. The leading task's output (the chief,
else worker 0) is streamed live; every task is logged to ``LOG_DIR/<type>.<index>.log``.

    >>> result = run(["python", "train.py", "--epochs", "2"], workers=2)   # doctest: +SKIP

For the fault-tolerance demo (:mod:`labkit.tfdist.faults`), :class:`Cluster` kills and restarts single tasks::

    with Cluster(cmd, workers=2) as c:
        c.start()
        c.wait_for_output(r"Epoch 2/", timeout=120)
        c.kill_task("worker", 1)
        c.restart_dead()
        result = c.wait(timeout=300)
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core import contract, output, proc, progress, tfconfig
from labkit.instrument.start import command as probe_command
from labkit.launching import hosts, jobspec, launchers
from labkit.launching.hosts import Host
from labkit.launching.jobspec import JobSpec
from labkit.launching.reach import HostWatch
from labkit.nodes import access
from labkit.records import runs
from labkit.tfdist.cluster_result import ClusterResult, Task, record
from labkit.tfdist.control import TaskControl

TaskId = tuple[str, int]


@dataclass(frozen=True)
class Tasks:
    """A tf.distribute cluster's tasks: ``workers`` workers, ``ps`` parameter servers and a chief, on free local
    ports or at ``hosts`` (``host:port`` per task, in TF_CONFIG's order), or placed on the machines of
    ``host_list`` (hosts with slots; remote ones started over ssh with ``ssh_args``, by default the virtual
    nodes' ssh config). ``task_cwd(type, index)``: each task's working folder. ``show``: the task whose output
    is shown (default: the chief, else worker 0). ``independent``: the same command ``workers`` times without
    TF_CONFIG, single-worker copies that do not communicate (the ceiling a machine gives that many workers)."""

    workers: int = 2
    ps: int = 0
    chief: bool = False
    hosts: Sequence[str] | None = None
    host_list: Sequence[Host] | None = None
    ssh_args: Sequence[str] = ()
    task_cwd: Callable[[str, int], str | Path | None] | None = None
    show: TaskId | None = None
    independent: bool = False


FIELDS = frozenset(f.name for f in dataclasses.fields(Tasks))


def split(options: Mapping[str, Any]) -> tuple[Tasks, JobSpec]:
    """The :class:`Tasks` and the :class:`~labkit.launching.jobspec.JobSpec` among keyword ``options`` (a
    notebook cell's flat ones); TypeError names an option that is neither."""
    job, rest = jobspec.split(options)
    unknown = sorted(k for k in rest if k not in FIELDS)
    if unknown:
        raise TypeError(f"not an option of a tf.distribute cluster: {', '.join(unknown)}")
    return Tasks(**rest), job


class Cluster(TaskControl):
    """The processes of one tf.distribute cluster on this machine.

    ``command`` runs once per task with ``TF_CONFIG`` set. ``cluster`` is a spec
    from :func:`labkit.core.tfconfig.cluster_spec` (default: ``workers`` workers,
    ``ps`` parameter servers, an optional chief, on free local ports). The run
    ends when every *leading* task has exited: all workers (and the chief) for
    all-reduce strategies; only the chief when there are parameter servers
    (workers and servers then serve forever and are stopped).
    """

    def __init__(self, command: Sequence[str] | str, tasks: Tasks | None = None, job: JobSpec | None = None) -> None:
        tasks, job = tasks or Tasks(), job or JobSpec()
        workers, ps, chief, host_list, task_cwd = tasks.workers, tasks.ps, tasks.chief, tasks.host_list, tasks.task_cwd
        independent, show, ssh_args = tasks.independent, tasks.show, tasks.ssh_args
        threads, env, log_dir, cwd, sink = job.threads, job.env, job.log_dir, job.cwd, job.sink
        quiet, record, target, stop_when = job.quiet, job.record, job.target, job.stop_when
        self.timeout = job.timeout  # wait()'s, unless it is given one
        if isinstance(command, str):
            command = shlex.split(command)
        if not command:
            raise launchers.LaunchError("nothing to run: give a command, e.g. ['python', 'train.py']")
        self.command = launchers.python_command(command)
        if host_list:
            try:
                self.spec = hosts.tf_cluster(list(host_list), workers, ps=ps, chief=chief)
            except hosts.HostError as e:
                raise launchers.LaunchError(str(e)) from None
        else:
            addresses = list(tasks.hosts) if tasks.hosts else None
            self.spec = tfconfig.cluster_spec(workers, ps, chief, hosts=addresses)
        self.host_list = list(host_list or [])
        self.stop_when = stop_when  # asked while the run waits, with its observations' folder: a reason stops it
        # Virtual nodes: their ssh config.
        self.ssh_args = list(ssh_args) or access.ssh_args([h.name for h in self.host_list])
        self.job = proc.Job()
        self.job_id = self.job.id
        self.log_dir = Path(log_dir) if log_dir else proc.new_log_dir(Path(cwd or ".") / "runs" / "logs")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.log_dir.resolve()
        n = len(tfconfig.tasks(self.spec))
        # Parameter servers mostly wait: give the cores to the chief and workers.
        busy = n - len(self.spec.get("ps", []))
        self.env = launchers.worker_env(max(1, busy), threads)
        if "ps" in self.spec:
            # With one inter-op thread, remote steps sent by the coordinator can deadlock on a worker.
            self.env["TF_NUM_INTEROP_THREADS"] = str(max(2, int(self.env["TF_NUM_INTEROP_THREADS"])))
        self.env.update(dict(env or {}))
        self.env["PYTHONUNBUFFERED"] = "1"
        # independent: the same command N times without TF_CONFIG, i.e. N single-worker copies
        # (the ceiling a machine gives N workers when they do not communicate).
        self.independent = independent
        self.record, self.target = record, target
        self.record_fields: dict = {}  # more fields for the run record (e.g. what a fault did)
        given = contract.JobEnv.from_env(self.env)
        self.records = (Path(cwd or ".") / (given.runs_file or runs.runs_file())).resolve()
        self.contract = contract.JobEnv(
            job_id=self.job_id, run_id=given.run_id or runs.new_run_id(), log_dir=str(self.log_dir),
            launcher=given.launcher or ("independent" if independent else "cluster"), threads=given.threads,
            runs_file=str(self.records) if record else given.runs_file, bench=given.bench,
        )
        self.env.update(self.contract.to_env())
        # What runs: with a record, each task's script under the run observer (labkit.instrument.start).
        self.observed = probe_command("run", str(self.log_dir / "observed"), self.command) if record else self.command
        self.cwd = cwd
        self.show = show or tfconfig.chief_task(self.spec)
        self.sink = None if quiet else (sink or progress.default_sink())
        self.renderers: dict[tuple[str, int], output.Renderer] = {}  # of the task whose output is shown
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
        self.serving = ps_run and "chief" in self.spec  # workers and servers only serve
        self.start_time: float | None = None
        self.start_wall: float | None = None
        (self.log_dir / "command.txt").write_text(
            "".join(f"{name}: {shlex.join(argv)}\n" for name, argv in self.commands().items()))
        (self.log_dir / "cluster.json").write_text(tfconfig.tf_config(self.spec, *self.show) + "\n")

    # -- processes -----------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start every task (servers first, so that the others find them)."""
        self.start_time = time.perf_counter()
        self.start_wall = time.time()
        order = sorted(self.tasks, key=lambda k: {"ps": 0, "worker": 1, "chief": 2}.get(k[0], 3))
        if self.sink and self.show in self.tasks:  # the task shown's command, as typed, before its output
            argv = self.argv(*self.show, typed=True)
            # A remote task's ssh command carries its TF_CONFIG itself; independent copies have none.
            with_config = argv == list(self.command) and not self.independent
            config = {"TF_CONFIG": tfconfig.tf_config(self.spec, *self.show)} if with_config else {}
            self.sink.line(output.command_line(argv, config))
            if len(self.tasks) > 1:
                what = "independent copies" if self.independent else "tasks, each with its own TF_CONFIG"
                self.sink.line(f"  ({len(self.tasks)} {what}: every command in {self.log_dir / 'command.txt'})")
        for key in order:
            self.start_task(*key)
        return self

    def task_env(self, task_type: str, index: int) -> dict[str, str]:
        """What one task gets on top of the environment: the job's settings and its TF_CONFIG."""
        env = {**self.env, contract.TASK: f"{task_type}.{index}"}
        if not self.independent:
            env["TF_CONFIG"] = tfconfig.tf_config(self.spec, task_type, index)
        return env

    def host_of(self, task_type: str, index: int) -> str:
        return self.spec[task_type][index].rsplit(":", 1)[0].strip("[]")

    def argv(self, task_type: str, index: int, typed: bool = False) -> list[str]:
        """The argument list that starts one task (over ssh when its host is another machine); with ``typed``, as
        a learner would type it (without the run observer)."""
        command = self.command if typed else self.observed
        host = self.host_of(task_type, index)
        if self.host_list and not hosts.is_local(host):
            where = self.tasks[(task_type, index)].cwd or self.cwd or Path.cwd()
            return launchers.remote_command(host, command, self.task_env(task_type, index), where, self.ssh_args)
        return list(command)

    def commands(self) -> dict[str, list[str]]:
        """Every task's argument list (pure: nothing is started)."""
        return {f"{t}.{i}": self.argv(t, i) for t, i in self.tasks}

    def start_task(self, task_type: str, index: int) -> Task:
        """Start (or start again) one task; its log is appended to."""
        task = self.tasks[(task_type, index)]
        if task.alive():
            raise launchers.LaunchError(f"{task.name} is already running")
        env: dict[str, str | None] = {**self.task_env(task_type, index)}
        if self.independent:
            env["TF_CONFIG"] = None  # copies of a single-worker run: no cluster at all
        task.starts += 1
        show = (task_type, index) == self.show and self.sink is not None
        renderer = output.Renderer(self.sink.line, self.sink.progress) if show and self.sink else None
        if renderer:
            self.renderers[(task_type, index)] = renderer
        header = f"\n--- {task.name} restarted (start {task.starts}) ---\n".encode() if task.starts > 1 else b""
        if renderer and header:
            renderer.on_line(f"--- {task.name} restarted ---")
        task.proc = self.job.spawn(
            self.argv(task_type, index), env=env, cwd=task.cwd or self.cwd, log=task.log,
            on_output=renderer.feed if renderer else None, on_end=renderer.close if renderer else None,
            name=task.name, resume_log=header)
        task.killed = False
        task.returncode = None
        return task

    def _over(self) -> bool:
        """The leading tasks have exited, or a task failed (with parameter servers, workers and servers serve
        until stopped: one that returns on its own ends the run at once instead of leaving the chief waiting)."""
        for key, t in self.tasks.items():
            if t.proc is None or t.killed:
                continue
            if t.proc.returncode not in (None, 0) or (
                    self.serving and key not in self.leading and t.proc.returncode is not None):
                return True
        return all(not self.tasks[k].alive() for k in self.leading)

    def wait(self, timeout: float | None = None) -> ClusterResult:
        """Wait until the leading tasks exit (or one task fails, or a host stops answering), then stop everything."""
        timed_out = interrupted = False
        stopped: str | None = None
        watch = HostWatch(self.host_list).start()  # a lost host ends the run, named, instead of a hang

        def over() -> bool:
            nonlocal stopped
            if self.stop_when is not None and stopped is None:
                stopped = self.stop_when(self.log_dir / "observed")
            return stopped is not None or self._over() or bool(watch.lost)

        try:
            timed_out = not proc.wait_until(over, timeout)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            watch.stop()
            self.stop()
        duration = time.perf_counter() - (self.start_time or time.perf_counter())
        result = ClusterResult.of_tasks(self.tasks, self.leading, self.log_dir, duration, timed_out, interrupted)
        result.lost = watch.message() if watch.lost else None
        result.stopped = stopped
        if self.record:
            result.record = record(self, result)
        if self.sink and not result.ok:
            for line in result.summary().splitlines():
                self.sink.line(line)
        if interrupted:
            raise KeyboardInterrupt(result.summary())
        return result

    def stop(self, grace: float = 3.0) -> None:
        """Stop every task of the cluster and anything they started."""
        for key, t in self.tasks.items():
            if t.alive():
                t.killed = t.killed or key not in self.leading  # servers are stopped on purpose
        self.job.stop(grace)
        for t in self.tasks.values():
            if t.proc is not None and t.returncode is None:
                t.returncode = t.proc.returncode

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run(command: Sequence[str] | str, tasks: Tasks | None = None, job: JobSpec | None = None) -> ClusterResult:
    """Start a cluster running ``command`` on every task, wait (at most ``job.timeout``), and clean up."""
    c = Cluster(command, tasks, job)
    try:
        c.start()
        return c.wait(c.timeout)
    finally:
        c.stop()
