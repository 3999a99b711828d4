"""Lab 9's elastic run: the learner's script with ``--elastic`` under ``horovodrun``'s elastic mode on this host, a
worker taken away and given back while it trains.

The job starts on 2 slots of this host (``labkit.launching.launchers.Elastic``: its host-discovery script prints
``hosts.now``). Its processes are observed from outside (:mod:`labkit.instrument.observe`): each call of ``fit`` and
each epoch's end. Once rank 0 finished ``LEAVE_AFTER`` epochs, ``hosts.now`` is given one slot, as a cluster
manager takes a machine away: Horovod stops one worker at the script's next commit of its elastic state, and an
elastic script goes on with the other from that commit (a new call of ``fit``). Once rank 0 finished ``AWAY``
epochs alone, the slot is given back: Horovod starts a new worker, which must join from the state the others hold.
A script that commits no state never shrinks: its workers train on to the end. No root: every worker is a process of
this host. A worker that never joins (a collective call outside the elastic function deadlocks it) stops the job
after ``JOIN_S`` seconds.

Given a hostfile (``labkit nodes up``'s virtual nodes, where root is there), the same run uses its first 2 hosts, one
worker each, and takes the second host away and gives it back instead: the worker leaves with its machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from labkit.core import contract
from labkit.launching import hosts, launch
from labkit.launching.jobspec import JobSpec
from labkit.launching.launchers import Elastic
from labkit.records import observation
from labkit.records.hvd_probe import ElasticRun, ElasticWorker

WORKERS = 2
EPOCHS, LEAVE_AFTER, AWAY = 24, 2, 2  # epochs of the run; rank 0's epochs before the leave, and then before the return
JOIN_S = 90.0  # seconds a returning worker may take to join, or to finish its first epoch once it called fit
# (it imports TensorFlow first: 10 s on the idle 2-core machine, 23 s while other tests shared its cores)
ARGS = ("--epochs", str(EPOCHS), "--train-size", "256", "--test-size", "64", "--batch-size", "16",
        "--val-batch-size", "16", "--base-lr", "0.02", "--warmup-epochs", "1", "--target-accuracy", "2", "--elastic")
REFUSED = "unrecognized arguments"
EVERY_S = 0.5  # seconds between two readings of the processes' observations


LOCAL = (f"localhost:{WORKERS}\n", "localhost:1\n")  # the discovery script's hosts: every worker, one away


class Pace:
    """What the check does while the job runs (``JobSpec.stop_when``): takes a slot away, gives it back, and
    stops a job whose returning worker does not join. ``lists``: the discovery script's lines with every worker,
    then with one away (this host's 2 slots, then 1, by default)."""

    def __init__(self, hosts_now: Path, start: float, lists: tuple[str, str] = LOCAL) -> None:
        self.hosts_now, self.start = hosts_now, start
        self.whole, self.fewer = lists
        self.left: float | None = None
        self.returned: float | None = None
        self.read_at = float("-inf")

    def __call__(self, observed: Path) -> str | None:
        if time.time() - self.read_at < EVERY_S:  # the launcher asks 5 times a second; an epoch takes about one
            return None
        self.read_at = time.time()
        workers = trained(observation.read(observed), self.start)
        chief = next((w for w in workers if w.rank == 0), None)
        done = len(chief.epochs) if chief else 0
        now = time.time() - self.start
        if self.left is None and done >= LEAVE_AFTER:
            self._hosts(self.fewer)
            self.left = now
        elif self.left is not None and self.returned is None and chief is not None and alone(chief, self.left):
            self._hosts(self.whole)
            self.returned = now
        elif self.returned is not None:
            joined = [w for w in workers if w.fit_starts and w.fit_starts[0] > self.returned]
            if not joined and now - self.returned > JOIN_S:
                return f"the returning worker had not joined {JOIN_S:.0f} s after its slot came back"
            if joined and not any(w.epochs for w in joined) and now - joined[0].fit_starts[0] > JOIN_S:
                return f"the returning worker called fit but finished no epoch in {JOIN_S:.0f} s"
        return None

    def _hosts(self, lines: str) -> None:
        tmp = self.hosts_now.with_name(self.hosts_now.name + ".tmp")  # the discovery script never reads half a file
        tmp.write_text(lines)
        tmp.replace(self.hosts_now)


def alone(chief: ElasticWorker, left: float) -> bool:
    """Whether rank 0 called fit again after ``left`` (the job shrank) and finished ``AWAY`` epochs since."""
    again = next((t for t in chief.fit_starts if t > left), None)
    return again is not None and sum(1 for end in chief.epoch_ends if end > again) >= AWAY


def trained(observations: list[observation.Observation], start: float) -> list[ElasticWorker]:
    """The observed processes that called ``fit``, oldest first; times since ``start``."""
    return [ElasticWorker(o.pid, o.world.rank if o.world else None, [_int(f.initial_epoch) for f in o.fits],
                          [round(f.start - start, 2) for f in o.fits], [_int(f.epochs) for f in o.fits],
                          [e.epoch for e in o.epochs], [round(e.end - start, 2) for e in o.epochs])
            for o in observations if o.fits]


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def on_hosts(hostfile: Path, work: Path) -> tuple[Path, tuple[str, str]]:
    """For a hostfile of at least ``WORKERS`` hosts: a hostfile of its first ``WORKERS`` hosts with one slot each
    (written in ``work``), and the discovery script's lines, both hosts and then the first alone."""
    found = hosts.parse_hostfile(hostfile)[:WORKERS]
    if len(found) < WORKERS:
        raise ValueError(f"the elastic run on other hosts needs {WORKERS} hosts (one leaves); {hostfile} lists "
                         f"{len(found)}")
    one_slot = work / "hostfile"
    one_slot.write_text("".join(f"{h.name} slots=1\n" for h in found))
    return one_slot, ("".join(f"{h.name}:1\n" for h in found), f"{found[0].name}:1\n")


def run(script: Path, work: Path, timeout: float, hostfile: Path | None = None) -> ElasticRun:
    """Run ``script`` elastically on this host's 2 slots (or ``hostfile``'s 2 hosts), a worker taken away and given
    back; what happened."""
    logs = work / "elastic-logs"
    logs.mkdir(parents=True, exist_ok=True)
    hostfile, lists = on_hosts(hostfile, work) if hostfile else (None, LOCAL)
    start = time.time()
    pace = Pace(Elastic.files({contract.LOG_DIR: str(logs.resolve())})[0], start, lists)
    spec = JobSpec(timeout=timeout, threads=1, log_dir=logs, quiet=True, cwd=work, record=True, stop_when=pace,
                   env={contract.RUNS_FILE: str((work / "elastic-runs.jsonl").resolve())})
    job = launch.run([sys.executable, str(script), *ARGS], WORKERS, "elastic", spec,
                     hosts=None if hostfile else LOCAL[0].strip(), hostfile=hostfile)
    text = "\n".join(job.log(r) for r in range(WORKERS)) + "\n" + job.summary()
    said = (job.summary().splitlines() or [""])[0][:500]  # how the job ended; the logs hold the rest
    refused = REFUSED in text and "--elastic" in text
    return ElasticRun(EPOCHS, LEAVE_AFTER, AWAY, job.ok, said, refused, pace.left, pace.returned, job.stopped,
                      trained(observation.read(logs / "observed"), start))
