"""The course's reference results: what the final solutions gave when run as the notebooks run them.

The notebooks never run solutions. A cell that needs a finished script shows, while the learner's
script is still the starter, these results instead (the same tables and plots, drawn from the
records). They are made from real runs by::

    python -m labkit.measure.reference [--out labs/reference] [--epochs 2]

which runs each lab's final solution in small mode for a few epochs and writes ``runs.jsonl`` (the
run records, each tagged with the ``reference`` it belongs to), ``results.json`` (what is not a run
record: the sweeps' conditions, the kill-and-resume epochs) and a README with the date, the machine
and the command. A released course ships the folder as ``labs/reference/``.
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
from pathlib import Path
from typing import Any

from labkit.core import identity
from labkit.course import labs
from labkit.launching import engines, launch
from labkit.measure import bench
from labkit.records import runs, sweep
from labkit.tfdist import cluster, faults
from labkit.tfdist.faults import ResumeReport

RECORDS, RESULTS = "runs.jsonl", "results.json"
TAG = "reference"  # the record field naming which reference a record belongs to


def folder() -> Path:
    """``reference/`` next to the notebook (cells run in ``labs/``), else the course's ``labs/reference``."""
    here = Path("reference")
    return here if (here / RECORDS).is_file() else labs.ROOT / "labs" / "reference"


def _results() -> dict[str, Any]:
    path = folder() / RESULTS
    return json.loads(path.read_text()) if path.is_file() else {}


def records(name: str) -> list[dict[str, Any]]:
    """The reference run records called ``name`` (e.g. ``"learning-rate"``), oldest first."""
    found = [r for r in runs.read(folder() / RECORDS, warn=False) if r.get(TAG) == name]
    if not found:
        raise LookupError(f"no reference records called {name!r} in {folder() / RECORDS}")
    return found


def record(name: str, **match: Any) -> dict[str, Any]:
    """The reference run record called ``name`` whose fields equal ``match`` (e.g. ``workers=2``), the last
    if several; a sweep's independent copies (its ceiling) are left out."""
    found = [r for r in runs.select(records(name), **match) if not sweep.is_ceiling(r)]
    if not found:
        raise LookupError(f"no reference record {name!r} with {match}")
    return found[-1]


def labelled(name: str) -> dict[str, dict[str, Any]]:
    """``{label: record}`` of the reference runs called ``name`` (for plots that name their runs)."""
    return {str(r.get("label") or r.get("run_id")): r for r in records(name)}


def sweep_of(name: str) -> sweep.Sweep:
    """A reference benchmark sweep, read back from its records (prints and plots like a new one)."""
    recs = records(name)
    info = _results().get(name, {})
    return sweep.Sweep(info.get("script", str(recs[0].get("script"))),
                       sweep.points_from_records(recs, info.get("conditions", {}).get("threads")),
                       info.get("conditions", {}), records=recs)


def resume_report(name: str = "kill-and-resume") -> ResumeReport:
    """The reference kill-and-resume run: epochs before the kill and after the restart."""
    info = _results().get(name)
    if not info:
        raise LookupError(f"no reference result called {name!r} in {folder() / RESULTS}")
    return ResumeReport(info["killed"], info["before"], info["after"])


def made() -> str:
    """When and where the reference results were made."""
    info = _results().get("made", {})
    return f"made on {info.get('date', '?')} on {info.get('machine', '?')}"


def summary(rec: dict[str, Any]) -> str:
    """One line of a reference record: what ran, how fast, how accurate."""
    ips, acc = rec.get("images_per_sec"), rec.get("final_val_accuracy")
    what = rec.get("label") or Path(str(rec.get("script"))).name
    return (f"{what}: {rec.get('workers') or 1} worker(s), {rec.get('epochs_run') or '?'} epoch(s), "
            f"{'-' if ips is None else f'{ips:.0f}'} images/sec, validation accuracy "
            f"{'-' if acc is None else f'{acc:.3f}'}, {rec.get('duration_s') or 0:.0f} s, {rec.get('status')}")


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


def _tagged(path: Path, since: int, name: str, label: str | None = None) -> list[dict[str, Any]]:
    return [{**r, TAG: name, **({"label": label} if label else {})} for r in runs.read(path, warn=False)[since:]]


def make(out: Path, epochs: int = 2, lr_epochs: int = 4) -> Path:
    """Run the final solutions as the notebooks do (small mode, ``epochs`` epochs) and write the results."""
    py = sys.executable
    hvd, mirrored, multiworker, ps = (str(final_solution(labs.get(n)).resolve())
                                      for n in ("horovod", "mirrored", "multiworker", "parameter-server"))
    args = ["--mode", "small", "--epochs", str(epochs)]
    work = Path(tempfile.mkdtemp(prefix="labkit-reference-"))
    path = work / RECORDS
    saved_cwd, saved_file = os.getcwd(), os.environ.get(runs.FILE_VAR)
    os.environ[runs.FILE_VAR] = str(path)
    os.chdir(work)
    kept: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    started = time.time()

    def step(name: str, label: str | None, run: Any, tries: int = 3) -> Any:
        """Run one reference; a failed try (a busy machine can time a cluster's heartbeat out) is run again."""
        for k in range(1, tries + 1):
            since = len(runs.read(path, warn=False))
            print(f"--- {name}{f' ({label})' if label else ''}, try {k}", flush=True)
            try:
                value = run()
            except Exception as e:  # noqa: BLE001 - tried again, then raised
                if k == tries:
                    raise
                print(f"    failed ({e}); again", flush=True)
                continue
            new = _tagged(path, since, name, label)
            if k < tries and any(r.get("status") != "ok" for r in new):
                print("    a run failed; again", flush=True)
                continue
            kept.extend(new)
            return value
        return None

    try:
        for devices in ("1", "2"):  # lab 3: one and two logical devices
            step("mirrored", f"{devices} device(s)", lambda d=devices: cluster.run(
                [py, mirrored, *args, "--devices", d], workers=1, timeout=900, quiet=True))
        report = step("kill-and-resume", None, lambda: faults.kill_and_resume(  # lab 4: 3 epochs, kill in the 2nd
            [py, multiworker, "--mode", "small", "--epochs", str(max(3, epochs)), "--backup-dir", str(work / "bk")],
            workers=2, kill=("worker", 1), kill_in_epoch=2, timeout=900, quiet=True))
        results["kill-and-resume"] = {"killed": report.killed, "before": report.before, "after": report.after}
        step("engines", None, lambda: engines.run_on_engines(multiworker, args, workers=2, timeout=900,
                                                             cwd=work / "engines"))
        step("slowed-worker", None, lambda: faults.slowed_worker([py, ps, *args], share=0.2, quiet=True))
        step("parameter-server", None, lambda: cluster.run([py, ps, *args], workers=2, ps=1, chief=True,
                                                            timeout=900, quiet=True))
        for name, script, launcher, extra in (
                ("horovod-sweep", hvd, "mpirun", []),
                ("tf-sweep", multiworker, "cluster", ["--backup-dir", str(work / "tfbk"),
                                                      "--model-path", str(work / "tf_model.keras")])):
            s = step(name, None, lambda sc=script, la=launcher, ex=extra: bench.bench(
                sc, nps=[1, 2], threads=1, args=[*args, *ex], launcher=la, timeout=900, runs_file=path,
                ceiling=la == "mpirun"))
            results[name] = {"script": Path(script).name, "conditions": {**s.conditions, "runs_file": RECORDS}}
        lr_args = ["--mode", "small", "--epochs", str(lr_epochs)]
        for label, extra in (("×2, warm-up", []), ("×2, no warm-up", ["--warmup-epochs", "0"]),
                             ("not scaled", ["--base-lr", "0.025", "--warmup-epochs", "0"])):  # lab 6
            step("learning-rate", label, lambda ex=extra: launch.run([py, hvd, *lr_args, *ex], np=2, threads=1,
                                                                   timeout=900, quiet=True))
    finally:
        os.chdir(saved_cwd)
        if saved_file is None:
            os.environ.pop(runs.FILE_VAR, None)
        else:
            os.environ[runs.FILE_VAR] = saved_file
    minutes = (time.time() - started) / 60
    results["made"] = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "minutes": round(minutes, 1),
                       "epochs": epochs, "lr_epochs": lr_epochs, "load_average": [round(x, 1) for x in os.getloadavg()]}
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORDS).write_text("".join(json.dumps(_portable(r), separators=(",", ":")) + "\n" for r in kept))
    (out / RESULTS).write_text(json.dumps(results, indent=1) + "\n")
    (out / "README.md").write_text(_readme(results["made"]))
    shutil.rmtree(work, ignore_errors=True)
    return out


def _portable(rec: dict[str, Any]) -> dict[str, Any]:
    """A record without this machine's folders: scripts by name, no log folder."""
    out = {k: v for k, v in rec.items() if k not in ("log_dir", "runs_file")}
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
    return f"""# Reference results

What the course's final solutions gave when run the way the notebooks run them. A notebook cell
that needs a finished script shows these (the same tables and plots) while your script is still
the starter; once you have changed it, every cell runs yours.

* Made on {made['date']} on {made['machine']}, in {made['minutes']} minutes. The machine was
  shared with other work (load average {made['load_average'][0]} at the end, on its cores): these
  images/sec are lower than an idle machine's, and runs that share cores speed up less.
* Small mode (WRN-16-1, 6,000 training and 1,000 test images), {made['epochs']} epochs per run
  ({made['lr_epochs']} for the learning-rate runs of lab 6): enough for images/sec (the first epoch
  is left out) and the first points of a curve, not for the target accuracy: kept short, as the
  whole set trains 14 runs one after another.
* Made with `python -m labkit.measure.reference --out labs/reference` from the course source (it runs
  the solutions, which a learner's copy does not hold).

Files: `runs.jsonl` (one run record per line, `reference` names the cell's use, `label` the
variant), `results.json` (the sweeps' conditions, the kill-and-resume epochs, this date).
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.measure.reference", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(labs.ROOT / "labs" / "reference"), help="folder to write")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run (default: %(default)s)")
    p.add_argument("--lr-epochs", type=int, default=4, help="epochs of the learning-rate runs")
    a = p.parse_args(argv)
    if not (labs.ROOT / "solutions").is_dir():
        print("python -m labkit.measure.reference: no solutions/ here: run it in the course source", file=sys.stderr)
        return 2
    print(f"wrote {make(Path(a.out), a.epochs, a.lr_epochs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
