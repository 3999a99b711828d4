"""The course's reference results: what the final solutions gave when run as the notebooks run them.

The notebooks never run solutions. A cell that needs a finished script shows, while the learner's
script is still the starter, these results instead (the same tables and plots, drawn from the
records). They are made from real runs by::

    python -m labkit.measure.reference [--out labs/reference]

which runs each lab's final solution in small mode (the demonstrations for a few epochs, the scaling sweeps
until they reach the target accuracy) and writes ``runs.jsonl`` (the run records, each tagged with the
``reference`` it belongs to), ``results.json`` (what is not a run record: the sweeps' conditions, the
kill-and-resume epochs, how idle the machine was) and a README with the date, the machine and the command.
It must be made on an idle machine: it refuses when other programs use more than ``IDLE_SHARE`` of the cores
before it starts, and records their share over each run. A released course ships the folder as
``labs/reference/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from labkit.core import identity, machineload
from labkit.course import labs
from labkit.launching import engines, launch
from labkit.launching.jobspec import JobSpec
from labkit.measure import bench
from labkit.records import runs, sweep, typed
from labkit.records.runrecord import RunRecord
from labkit.tfdist import cluster, faults
from labkit.tfdist.cluster import Tasks
from labkit.tfdist.faults import ResumeReport

RECORDS, RESULTS = "runs.jsonl", "results.json"
TAG = "reference"  # the record field naming which reference a record belongs to
IDLE_SHARE = 0.10  # most of the cores other programs may use while the references are made


@dataclass(frozen=True)
class Plan:
    """How long each kind of reference run trains (small mode)."""

    epochs: int = 2  # the demonstrations (labs 3-5)
    sweep_epochs: int = 15  # lab 6's sweeps: at most this many, each run stops at the target accuracy
    lr_epochs: int = 6  # lab 6's learning-rate runs (as many as the notebook's cell trains)
    busy_ok: bool = False  # make them even on a busy machine (said in the README)


class Missing(LookupError):
    """A reference result the course does not have."""


def folder(root: Path | None = None) -> Path:
    """The reference results of the course at ``root`` (its ``labs/reference``); without one, ``reference/`` next to
    the notebook (cells run in ``labs/``), else this course's ``labs/reference``."""
    if root is not None:
        return root / "labs" / "reference"
    here = Path("reference")
    return here if (here / RECORDS).is_file() else labs.ROOT / "labs" / "reference"


def _results(where: Path | None = None) -> dict[str, Any]:
    path = (where or folder()) / RESULTS
    return json.loads(path.read_text()) if path.is_file() else {}


def records(name: str, where: Path | None = None) -> list[RunRecord]:
    """The reference run records called ``name`` (e.g. ``"learning-rate"``) in the folder ``where`` (default:
    :func:`folder`), oldest first."""
    path = (where or folder()) / RECORDS
    found = [r for r in runs.read(path, warn=False) if r.extra.get(TAG) == name]
    if not found:
        raise Missing(f"no reference records called {name!r} in {path}")
    return found


def record(name: str, where: Path | None = None, **match: Any) -> RunRecord:
    """The reference run record called ``name`` whose fields equal ``match`` (e.g. ``workers=2``), the last
    if several; a sweep's independent copies (its ceiling) are left out."""
    found = [r for r in runs.select(records(name, where), **match) if not sweep.is_ceiling(r)]
    if not found:
        raise Missing(f"no reference record {name!r} with {match}")
    return found[-1]


def labelled(name: str, where: Path | None = None) -> dict[str, RunRecord]:
    """``{label: record}`` of the reference runs called ``name`` (for plots that name their runs)."""
    return {str(r.extra.get("label") or r.run_id): r for r in records(name, where)}


def sweep_of(name: str, where: Path | None = None) -> sweep.Sweep:
    """A reference benchmark sweep, read back from its records (prints and plots like a new one)."""
    recs = records(name, where)
    info = _results(where).get(name, {})
    return sweep.Sweep(info.get("script", str(recs[0].script)),
                       sweep.points_from_records(recs, info.get("conditions", {}).get("threads")),
                       info.get("conditions", {}), records=recs)


def resume_report(name: str = "kill-and-resume") -> ResumeReport:
    """The reference kill-and-resume run: epochs before the kill and after the restart."""
    info = _results().get(name)
    if not info:
        raise Missing(f"no reference result called {name!r} in {folder() / RESULTS}")
    return ResumeReport(info["killed"], info["before"], info["after"])


def made() -> str:
    """When and where the reference results were made."""
    info = _results().get("made", {})
    return f"made on {info.get('date', '?')} on {info.get('machine', '?')}"


def banner() -> str:
    """When, where and how the reference results were made, in one line for the cells that show them."""
    info = _results().get("made", {})
    other = info.get("other_work")
    idle = (f", other programs using {100 * other:.0f}% of its cores" if isinstance(other, (int, float)) else "")
    busy = "; made on a busy machine (--busy-ok)" if info.get("busy_ok") else ""
    return (f"the reference results were made on {info.get('date', '?')} on {info.get('machine', '?')}{idle}{busy}, "
            "by `python -m labkit.measure.reference` (reference/README.md says how)")


def summary(rec: RunRecord) -> str:
    """One line of a reference record: what ran, how fast, how accurate."""
    ips, acc = rec.images_per_sec, rec.final_val_accuracy
    what = rec.extra.get("label") or Path(str(rec.script)).name
    return (f"{what}: {rec.workers or 1} worker(s), {rec.epochs_run or '?'} epoch(s), "
            f"{'-' if ips is None else f'{ips:.0f}'} images/sec, validation accuracy "
            f"{'-' if acc is None else f'{acc:.3f}'}, {rec.duration_s or 0:.0f} s, {rec.status}")


def show(name: str) -> None:
    """Print the reference runs called ``name``, one line each, with when they were made."""
    print(f"the course's reference results ({made()}):")
    for rec in records(name):
        print("  " + summary(rec))


# ----------------------------------------------------------------------------- making them


def final_solution(lab: labs.Lab, root: Path = labs.ROOT) -> Path:
    """The last solution of ``lab``: ``<stem>_solution.py`` when there is one, else the last step's."""
    whole = root / "solutions" / f"{lab.stem}_solution.py"
    steps = sorted((root / "solutions").glob(f"{lab.stem}_after_step_[0-9][0-9].py"))
    return whole if whole.is_file() else steps[-1] if steps else lab.solution(root=root)


def _tagged(path: Path, since: int, name: str, label: str | None = None) -> list[RunRecord]:
    return [r.with_extra(**{TAG: name, **({"label": label} if label else {})})
            for r in runs.read(path, warn=False)[since:]]


class BusyMachine(RuntimeError):
    """Other programs use the machine: the references would teach a slow machine's lesson."""


def idle_or_refuse(busy_ok: bool = False) -> machineload.Share | None:
    """Other programs' share of the machine, watched for 10 s before a reference is made; :class:`BusyMachine`
    when it is more than :data:`IDLE_SHARE` (unless ``busy_ok``)."""
    before = machineload.idle_now(10)
    if before is not None and before.share > IDLE_SHARE and not busy_ok:
        raise BusyMachine(f"{before}: make the reference on an idle machine (or pass --busy-ok)")
    return before


def make(out: Path, plan: Plan = Plan()) -> Path:
    """Run the final solutions as the notebooks do (small mode) and write the results."""
    epochs = plan.epochs
    before = machineload.idle_now(10)
    if before is not None:
        print(f"before starting: {before}", flush=True)
        if before.share > IDLE_SHARE and not plan.busy_ok:
            raise BusyMachine(f"{before}: more than {100 * IDLE_SHARE:.0f}%; make the references on an idle "
                              "machine (or pass --busy-ok, and the README says the machine was busy)")
    watch = machineload.OtherWork(identity.cpu_count())
    shares: dict[str, float] = {}
    py = sys.executable
    hvd, mirrored, multiworker, ps = (str(final_solution(labs.get(n)).resolve())
                                      for n in ("horovod", "mirrored", "multiworker", "parameter-server"))
    args = ["--mode", "small", "--epochs", str(epochs)]
    work = Path(tempfile.mkdtemp(prefix="labkit-reference-"))
    path = work / RECORDS
    saved_cwd, saved_file = os.getcwd(), os.environ.get(runs.FILE_VAR)
    os.environ[runs.FILE_VAR] = str(path)
    os.chdir(work)
    kept: list[RunRecord] = []
    results: dict[str, Any] = {}
    started = time.time()

    def step(name: str, label: str | None, run: Any, tries: int = 3) -> Any:
        """Run one reference; a failed try (a busy machine can time a cluster's heartbeat out) is run again."""
        for k in range(1, tries + 1):
            since = len(runs.read(path, warn=False))
            print(f"--- {name}{f' ({label})' if label else ''}, try {k}", flush=True)
            during = machineload.OtherWork(identity.cpu_count())
            try:
                value = run()
            except Exception as e:  # noqa: BLE001 - tried again, then raised
                if k == tries:
                    raise
                print(f"    failed ({e}); again", flush=True)
                continue
            new = _tagged(path, since, name, label)
            if k < tries and any(r.status != "ok" for r in new):
                print("    a run failed; again", flush=True)
                continue
            kept.extend(new)
            share = during.share()
            if share is not None:
                shares[f"{name} ({label})" if label else name] = round(share.share, 3)
                print(f"    {share}", flush=True)
            return value
        return None

    try:
        for devices in ("1", "2"):  # lab 3: one and two logical devices
            step("mirrored", f"{devices} device(s)",
                 lambda d=devices: cluster.run([py, mirrored, *args, "--devices", d], tasks=Tasks(workers=1),
                                               job=JobSpec(timeout=900, quiet=True)))
        report = step("kill-and-resume", None, lambda: faults.kill_and_resume(  # lab 4: 3 epochs, kill in the 2nd
            [py, multiworker, "--mode", "small", "--epochs", str(max(3, epochs)), "--backup-dir", str(work / "bk")],
            workers=2, kill=("worker", 1), kill_in_epoch=2, timeout=900, quiet=True))
        results["kill-and-resume"] = {"killed": report.killed, "before": report.before, "after": report.after}
        step("engines", None, lambda: engines.run_on_engines(multiworker, args, workers=2, timeout=900,
                                                             cwd=work / "engines"))
        step("slowed-worker", None, lambda: faults.slowed_worker([py, ps, *args], share=0.2, quiet=True))
        step("parameter-server", None,
             lambda: cluster.run([py, ps, *args], tasks=Tasks(workers=2, ps=1, chief=True),
                                 job=JobSpec(timeout=900, quiet=True)))
        sweep_args = ["--mode", "small", "--epochs", str(plan.sweep_epochs)]
        for name, script, launcher, extra in (
                ("horovod-sweep", hvd, "mpirun", []),
                ("tf-sweep", multiworker, "cluster", ["--backup-dir", str(work / "tfbk"),
                                                      "--model-path", str(work / "tf_model.keras")])):
            s = step(name, None, lambda sc=script, la=launcher, ex=extra: bench.bench(
                sc, bench.SweepPlan(nps=[1, 2], args=[*sweep_args, *ex], launcher=la, runs_file=path,
                                    ceiling=la == "mpirun"), JobSpec(threads=1, timeout=900, quiet=True)))
            results[name] = {"script": Path(script).name, "conditions": {**s.conditions, "runs_file": RECORDS}}
        lr_args = ["--mode", "small", "--epochs", str(plan.lr_epochs)]
        for label, extra in (("×2, warm-up", []), ("×2, no warm-up", ["--warmup-epochs", "0"]),
                             ("not scaled", ["--base-lr", "0.025", "--warmup-epochs", "0"])):  # lab 6
            step("learning-rate", label,
                 lambda ex=extra: launch.run([py, hvd, *lr_args, *ex], job=JobSpec(threads=1, timeout=900, quiet=True),
                                             np=2))
    finally:
        os.chdir(saved_cwd)
        if saved_file is None:
            os.environ.pop(runs.FILE_VAR, None)
        else:
            os.environ[runs.FILE_VAR] = saved_file
    minutes = (time.time() - started) / 60
    total = watch.share()
    results["made"] = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "minutes": round(minutes, 1),
                       **asdict(plan), "other_work_before": round(before.share, 3) if before else None,
                       "other_work": round(total.share, 3) if total else None, "other_work_by_run": shares,
                       "load_average_end": [round(x, 1) for x in os.getloadavg()]}
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORDS).write_text("".join(json.dumps(_portable(r), separators=(",", ":")) + "\n" for r in kept))
    (out / RESULTS).write_text(json.dumps(results, indent=1) + "\n")
    (out / "README.md").write_text(_readme(results["made"]) + _communication(out))
    shutil.rmtree(work, ignore_errors=True)
    return out


def _portable(rec: RunRecord) -> dict[str, Any]:
    """A record without this machine's folders: scripts by name, no log folder."""
    out = {k: v for k, v in typed.dump(rec).items() if k not in ("log_dir", "runs_file")}
    if out.get("script"):
        out["script"] = Path(str(out["script"])).name
    if isinstance(out.get("command"), list):
        out["command"] = [Path(c).name if os.sep in str(c) else c for c in out["command"]]
    return out


def machine() -> str:
    """This machine in a few words: cores and CPU model, GPUs if any."""
    cpu = identity.device_info().get("cpu") or platform.machine()
    if shutil.which("nvidia-smi"):
        return f"{cpu}, with GPUs"
    return f"{identity.cpu_count()} CPU cores ({cpu}), no GPU"


def _readme(made: dict[str, Any]) -> str:
    other = made.get("other_work")
    idle = (f"Other programs used {100 * other:.1f}% of its cores while they ran (measured from `/proc/stat` "
            f"minus the runs' own CPU time; the script refuses to start above {100 * IDLE_SHARE:.0f}%)"
            if other is not None else "How busy the machine was could not be measured")
    busy = (" It was made with `--busy-ok` on a busy machine: its images/sec are lower, and its speedups smaller, "
            "than an idle machine's." if made.get("busy_ok") else "")
    return f"""# Reference results

What the course's final solutions gave when run the way the notebooks run them. A notebook cell
that needs a finished script shows these (the same tables and plots) while your script has not yet passed
its lab's steps in your checks; once that very version has, the cell runs yours.

* Made on {made['date']} on {made['machine']}, in {made['minutes']} minutes, on an idle machine. {idle}.{busy}
* Small mode (WRN-16-1, 6,000 training and 1,000 test images, 1 thread per worker). Lab 6's scaling sweeps
  train up to {made['sweep_epochs']} epochs and stop after their second epoch at or above the target accuracy
  (82%), so their time to accuracy is measured; its learning-rate runs train {made['lr_epochs']} epochs, as the
  notebook's cell does; the demonstrations of labs 3-5 train {made['epochs']} epochs (3 for kill-and-resume). Images/sec
  leave out each run's first epoch.
* One run per point: a single run scatters by a few percent; the benchmark's README figures, made with repeats,
  are in `docs/performance.md`.
* Made with `python -m labkit.measure.reference --out labs/reference` from the course source (it runs
  the solutions, which a learner's copy does not hold).

Files: `runs.jsonl` (one run record per line, `reference` names the cell's use, `label` the
variant), `results.json` (the sweeps' conditions, the kill-and-resume epochs, the date, and other programs'
share of the cores over each run).
"""


def _communication(out: Path) -> str:
    """The README's paragraph on ``communication.json`` (lab 8), made apart by its own command, when it is there."""
    try:
        made = json.loads((out / "communication.json").read_text()).get("made") or {}
    except (OSError, ValueError):
        return ""
    return (f"\n`communication.json` (lab 8): the all-reduce and two of Horovod's knobs on 2 virtual nodes with links "
            f"of 200 Mbit/s, made on {made.get('date', '?')} on {made.get('machine', '?')} with "
            f"`python -m labkit.measure.comm_reference --out labs/reference` (root).\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.measure.reference", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(labs.ROOT / "labs" / "reference"), help="folder to write")
    d = Plan()
    p.add_argument("--epochs", type=int, default=d.epochs, help="epochs of the demonstrations (default: %(default)s)")
    p.add_argument("--sweep-epochs", type=int, default=d.sweep_epochs,
                   help="most epochs of the scaling sweeps' runs, which stop at the target (default: %(default)s)")
    p.add_argument("--lr-epochs", type=int, default=d.lr_epochs,
                   help="epochs of the learning-rate runs (default: %(default)s)")
    p.add_argument("--busy-ok", action="store_true", help="make them even when other programs use the machine")
    a = p.parse_args(argv)
    if not (labs.ROOT / "solutions").is_dir():
        print("python -m labkit.measure.reference: no solutions/ here: run it in the course source", file=sys.stderr)
        return 2
    try:
        out = make(Path(a.out), Plan(a.epochs, a.sweep_epochs, a.lr_epochs, a.busy_ok))
    except BusyMachine as e:
        print(f"python -m labkit.measure.reference: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
