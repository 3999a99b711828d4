"""Run a command on N workers from a cell or the command line, and never leave a process behind.

    result = run(["python", "train.py", "--epochs", "1"], np=2)                # mpirun on this machine
    result = run(cmd, np=8, hosts="node1:4,node2:4")                            # two machines
    result = run(cmd, launcher="slurm", slurm=SlurmOptions(nodes=2, tasks_per_node=4))

Every rank runs under :mod:`labkit.launching.rank`, which logs it to ``LOG_DIR/rank.N.log``;
rank 0's output is streamed live (Keras progress bars as one updating line). The
launcher (:mod:`labkit.launching.launchers`, :mod:`labkit.launching.slurm`) builds the commands; the
process layer (:mod:`labkit.core.proc`) starts them and, on exit, error, timeout or
interrupt, stops everything the job started. With ``record`` the processes are
observed from outside and the run is recorded (:mod:`labkit.records.jobrecord`).
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from labkit.core import contract, proc
from labkit.core.identity import cpu_count
from labkit.core.output import TAG, Renderer, command_line, error_tail, hints
from labkit.core.proc import new_log_dir
from labkit.core.progress import default_sink
from labkit.instrument.start import command as probe_command
from labkit.launching import hosts
from labkit.launching.jobspec import JobSpec
from labkit.launching.launchers import (
    Launcher,
    LaunchError,
    default_threads,
    python_command,
    typed,
    worker_env,
)
from labkit.launching.reach import HostWatch
from labkit.launching.slurm import SlurmOptions
from labkit.launching.table import get
from labkit.records import jobrecord, runs
from labkit.records.runrecord import RunRecord

__all__ = ["JobResult", "LaunchError", "run", "cpu_count", "default_threads", "worker_env", "new_log_dir"]


@dataclass
class JobResult:
    """What a launched job did."""

    returncode: int
    command: list[str]  # as a person would type it; what really ran, wrapper and all: LOG_DIR/command.txt
    log_dir: Path
    np: int
    duration: float
    timed_out: bool = False
    interrupted: bool = False
    rank_exit: dict[int, int] = field(default_factory=dict)
    rank_errors: dict[int, str] = field(default_factory=dict)
    record: RunRecord | None = None  # the run record, when the job was recorded
    lost: str | None = None  # why the job was stopped when a host stopped answering
    rank_hosts: dict[int, str] = field(default_factory=dict)  # where each rank ran (remote hosts)
    stopped: str | None = None  # why the caller's ``stop_when`` ended the job early

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.interrupted and not self.stopped

    def log(self, rank: int = 0) -> str:
        """The full output of one rank."""
        path = self.log_dir / f"rank.{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summary(self) -> str:
        if self.ok:
            return f"job finished OK in {self.duration:.1f} s ({self.np} workers); logs in {self.log_dir}"
        why = (
            f"stopped after {self.duration:.0f} s: {self.stopped}" if self.stopped
            else f"timed out after {self.duration:.0f} s" if self.timed_out
            else "interrupted" if self.interrupted
            else f"failed with exit code {self.returncode}"
        )
        lines = [f"job {why}; logs in {self.log_dir}"] + ([self.lost] if self.lost else [])
        for rank, err in sorted(self.rank_errors.items()):
            on = f" on {self.rank_hosts[rank]}" if rank in self.rank_hosts else ""
            lines.append(f"--- rank {rank}{on} (exit {self.rank_exit.get(rank, '?')}) ---")
            lines.append(err)
        advice = dict.fromkeys(a for err in self.rank_errors.values() for a in hints(err))
        lines += [f"hint: {a}" for a in advice]
        return "\n".join(lines)


def rank_hosts(log_dir: Path, np: int) -> dict[int, str]:
    """The host each rank ran on, from the wrapper's ``rank.N.host`` files (written when the rank starts)."""
    found = {r: (log_dir / f"rank.{r}.host").read_text().strip() for r in range(np)
             if (log_dir / f"rank.{r}.host").exists()}
    return found if len(set(found.values())) > 1 else {}


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
            errors[rank] = error_tail(log.read_text(errors="replace"))
    return exits, errors


def host_list(hosts_spec: str | None = None, hostfile: str | Path | None = None) -> list[hosts.Host]:
    """The hosts of ``--hosts h1:4,h2:4`` or ``--hostfile FILE`` (not both); empty for this machine."""
    if hosts_spec and hostfile:
        raise LaunchError("give either --hosts or --hostfile, not both")
    try:
        if hostfile:
            return hosts.parse_hostfile(hostfile)
        return hosts.parse_hosts(hosts_spec) if hosts_spec else []
    except hosts.HostError as e:
        raise LaunchError(str(e)) from None


def make_launcher(launcher: str | Launcher, np: int, hosts_spec: str | None = None,
                  hostfile: str | Path | None = None, slurm: SlurmOptions | None = None) -> Launcher:
    """A launcher object from ``run``'s arguments."""
    if isinstance(launcher, Launcher):
        return launcher
    if launcher == "slurm":
        if hosts_spec or hostfile:
            raise LaunchError("Slurm chooses the hosts: use --nodes and --tasks-per-node instead of --hosts")
        return get("slurm", np=None if slurm else np, options=slurm or SlurmOptions(tasks_per_node=np))
    if slurm is not None:
        raise LaunchError("--nodes/--tasks-per-node/--script-only are Slurm options: add --launcher slurm")
    return get(launcher, np=np, host_list=host_list(hosts_spec, hostfile))


def run(
    command: Sequence[str] | str,
    np: int = 2,
    launcher: str | Launcher = "mpirun",
    job: JobSpec | None = None,
    *,
    hosts: str | None = None,
    hostfile: str | Path | None = None,
    slurm: SlurmOptions | None = None,
    show_rank: int = 0,
) -> JobResult:
    """Run ``command`` on ``np`` workers and wait; never leaves a process behind.

    ``command`` is a list (``["python", "train.py", "--epochs", "1"]``); a string
    is split like a shell would, but never run through a shell. ``launcher`` is a
    name (``mpirun``, ``horovodrun``, ``gloo``, ``ssh``, ``slurm``) or a
    :class:`labkit.launching.launchers.Launcher`; ``hosts`` (``node1:2,node2:2``) or ``hostfile`` place the
    ranks, ``slurm`` says what the batch job asks for. ``job`` (:class:`~labkit.launching.jobspec.JobSpec`):
    its time limit, threads, environment, folders and output; with ``job.record`` the processes are observed
    and the job's run record is appended when it ends. ``job.stop_when(OBSERVED)`` is asked while the job runs;
    a reason it returns stops the job then (status ``stopped``, the reason as its error). ``show_rank``: the
    rank whose output is shown.
    """
    job = job or JobSpec()
    timeout, threads, env, log_dir, cwd = job.timeout, job.threads, job.env, job.log_dir, job.cwd
    sink, quiet, record, target, stop_when = job.sink, job.quiet, job.record, job.target, job.stop_when
    if isinstance(command, str):
        command = shlex.split(command)
    if not command:
        raise LaunchError("nothing to run: give a command, e.g. ['python', 'train.py']")
    command = python_command(command)
    chosen = make_launcher(launcher, np, hosts, hostfile, slurm)
    np = chosen.np
    chosen.preflight()
    work = proc.Job()
    logs = Path(log_dir) if log_dir else new_log_dir(Path(cwd or ".") / "runs" / "logs")
    logs.mkdir(parents=True, exist_ok=True)
    logs = logs.resolve()
    wenv = worker_env(np, threads)
    wenv.update(dict(env or {}))
    given = contract.JobEnv.from_env(wenv)
    records = (Path(cwd or ".") / (given.runs_file or runs.runs_file())).resolve()
    job_env = contract.JobEnv(
        job_id=work.id, run_id=given.run_id or time.strftime("%Y%m%d-%H%M%S-") + work.id[:6],
        launcher=given.launcher or chosen.name, log_dir=str(logs), show_rank=show_rank, np=np,
        threads=given.threads, runs_file=str(records) if record else given.runs_file,
    )
    wenv.update(job_env.to_env())
    observed = probe_command("run", str(logs / "observed"), command) if record else command
    wrapped = [sys.executable, "-m", "labkit.launching.rank", str(logs), "--", *observed]
    shown = [argv for _, argv, _ in chosen.commands(wrapped, wenv)]
    (logs / "command.txt").write_text("".join(shlex.join(a) + "\n" for a in shown))
    # What the learner could type for the same job (their own variables only); what really runs, with labkit's
    # wrapper and variables, is in command.txt.
    typed_command = typed(chosen.commands(command, env or {})[0][1])
    sink = None if quiet else (sink or default_sink())
    renderer = Renderer(sink.line, sink.progress) if sink else None
    if sink and chosen.name != "slurm":  # the command before its output (Slurm shows its batch script)
        sink.line(command_line(typed_command))
        sink.line(f"  (as run, with labkit's rank wrapper and variables: {logs / 'command.txt'})")

    def feed(chunk: bytes) -> None:
        if renderer:
            renderer.feed(TAG.sub(b"", chunk) if chosen.strip_tags else chunk)

    start, started = time.perf_counter(), time.time()
    timed_out = interrupted = False
    stopped: str | None = None
    procs: list[proc.Proc] = []
    first_failure: int | None = None  # before the rest are stopped (their SIGTERM is not the cause)
    watch = HostWatch(chosen.hosts).start()  # a host that stops answering ends the job, named
    try:
        procs = chosen.start(work, wrapped, wenv, logs, on_output=feed,
                             on_end=renderer.close if renderer else None, cwd=cwd)
        if not procs:  # only a script was written
            if sink:
                sink.line(f"batch script written: {chosen.script_path}")
            return JobResult(0, typed_command, logs, np, 0.0)
        if sink and chosen.name == "slurm":
            sink.line(f"submitted {logs / 'job.sbatch'}:")
            for line in (logs / "job.sbatch").read_text().splitlines():
                sink.line("    " + line)
        def over() -> bool:
            nonlocal stopped
            if stop_when is not None and stopped is None:
                stopped = stop_when(logs / "observed")
            return (stopped is not None or all(not p.alive() for p in procs)
                    or any(p.returncode not in (None, 0) for p in procs) or bool(watch.lost))

        finished = proc.wait_until(over, timeout)
        timed_out = not finished
        first_failure = next((p.returncode for p in procs if p.returncode not in (None, 0)), None)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        watch.stop()
        chosen.stop()
        work.stop()
    duration = time.perf_counter() - start
    exits, errors = collect_rank_results(logs, np)
    code = exit_code([p.returncode for p in procs], first_failure)
    if timed_out or interrupted:
        code = 124 if timed_out else 130
    if watch.lost and not (timed_out or interrupted):
        code = code or 1
    failed = [c for _, c in sorted(exits.items()) if c != 0]
    if code == 0 and failed and chosen.name != "elastic":
        # A rank's own exit (written by labkit's rank wrapper) counts even when the launcher reported 0 (seen now
        # and then with Slurm's srun); elastic mode replaces failed workers, so there their exits are not the job's.
        code = exit_code(failed)
    result = JobResult(code, typed_command, logs, np, duration, timed_out, interrupted, exits, errors,
                       lost=watch.message() if watch.lost else None, rank_hosts=rank_hosts(logs, np),
                       stopped=stopped)
    if record:
        status = ("ok" if result.ok else "stopped" if stopped else "timeout" if timed_out
                  else "interrupted" if interrupted else "failed")
        end = jobrecord.JobEnd(
            job_env.run_id or "", list(command), job_env.launcher or chosen.name, np, job_env.threads, started,
            duration, code, status, error=stopped or next(iter(errors.values()), None), log_dir=logs, target=target,
            extra={"bench": given.bench})
        result.record = jobrecord.finish(end, logs / "observed", records)
    if sink and not result.ok:
        for line in result.summary().splitlines():
            sink.line(line)
    if interrupted:
        raise KeyboardInterrupt(result.summary())
    return result


def exit_code(codes: list[int | None], first_failure: int | None = None) -> int:
    """One exit status for the job, the shell's way: the first failure, a signal ``s`` as ``128 + s``."""
    code = first_failure if first_failure is not None else next((c for c in codes if c not in (0, None)), None)
    if code is None:
        return 0 if codes and all(c == 0 for c in codes) else 1
    return 128 - code if code < 0 else code


