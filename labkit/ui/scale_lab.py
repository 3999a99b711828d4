"""Lab 9's measurement cells: mixed precision on this machine, beside the course's reference; the learner's own
profile.

``scale_lab.precision_speed()`` times the course's model in float32 and in mixed bfloat16
(:mod:`labkit.measure.precision`, one process each, nothing of the learner's script or of a solution), then prints
both speeds and the course's reference, made on an idle machine (``labs/reference/precision.json``), the median of
its repeats. In quick mode (the test suite's) each policy times a few batches.

``scale_lab.profile(SCRIPT)`` runs the learner's script on 2 workers with ``--profile-dir`` once its lab 9 step 4
passed, and shows where rank 0's profiled steps spent their time (:mod:`labkit.figures.step_profile`); before that,
the course's reference profile (:mod:`labkit.measure.profile_reference`).

``scale_lab.large_batch()`` shows the course's large-batch experiment (:mod:`labkit.measure.large_batch`): the
same epochs at ever larger global batches, the learning rate set three ways. ``scale_lab.large_batch(SCRIPT,
batches=..., epochs=...)`` runs the experiment on the learner's own script once its Horovod lab passed step 8 (the
rate scaled by the workers and warmed up), each run told as it ends.

``scale_lab.elastic_on_nodes(SCRIPT)`` runs step 5's elastic exercise across 2 of the virtual nodes ``labkit nodes up``
started (root): the second node leaves with its worker and comes back (:mod:`labkit.check.elastic_run`). Where none are
up it says how to start them; without root, why they cannot start.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from labkit.check import elastic_judge, elastic_run
from labkit.check.verdict import Failed
from labkit.figures import large_batch as drawn
from labkit.figures import step_profile
from labkit.instrument.precision_workload import POLICIES
from labkit.launching.launchers import LaunchError
from labkit.measure import large_batch as experiment
from labkit.measure import precision, profile_reference
from labkit.nodes.virtual import VirtualNodes
from labkit.records.hvd_probe import ElasticRun
from labkit.ui import nodes_lab, notebook

QUICK_BATCHES = 3


def _table(speeds: list[precision.Speed]) -> str:
    base = next((s.images_per_sec for s in speeds if s.policy == "float32"), None)
    rows = [f"  {'policy':<16}{'computes in':<13}{'images/sec':>11}{'vs float32':>12}"]
    for s in speeds:
        rel = f"{s.images_per_sec / base:.2f} x" if base else "-"
        rows.append(f"  {s.policy:<16}{'/'.join(s.compute_dtypes):<13}{s.images_per_sec:>11.0f}{rel:>12}")
    return "\n".join(rows)


def precision_speed(batches: int = precision.BATCHES) -> list[precision.Speed]:
    """Time the course's model in each precision on this machine; print it beside the course's reference."""
    n = QUICK_BATCHES if notebook.quick() else batches
    speeds = precision.compare(n)
    print(f"\nThis machine, one process per policy, {n} batches of {precision.BATCH} images:")
    print(_table(speeds))
    ref = precision.read()
    if ref is None:
        print("\n(no reference results for mixed precision in this course)")
        return speeds
    load = f", other programs {100 * ref.made.other_work:.0f}% of it" if ref.made.other_work is not None else ""
    ratios = ", ".join(f"{r:.2f}" for r in ref.ratios())
    print(f"\nThe course's reference ({ref.made.machine}, {ref.made.date}{load}; {ref.made.command}): the median "
          f"of {len(ref.ratios())} repeats (mixed bfloat16 over float32 in each: {ratios}):")
    print(_table([ref.typical(policy) for policy in POLICIES]))
    return speeds


def profile(script: str, epochs: int = 1) -> step_profile.Profile | None:
    """``script`` on 2 workers with ``--profile-dir`` (a new folder under ``runs/``): rank 0's profiled steps, split
    into compute, all-reduce, input and the rest, as a table and a picture; the course's reference profile while the
    script has not passed lab 9's step 4."""
    if notebook.ready(script, "at-scale", 4):
        folder = notebook.new_folder("profile")
        command = ["python", script, *notebook.args("--epochs", str(epochs), "--profile-dir", folder)]
        print(f"running {' '.join(command)} on {profile_reference.WORKERS} workers ...", flush=True)
        result = notebook.run(command, np=profile_reference.WORKERS)
        if not result.ok:
            print(result.summary())
            return None
        try:
            prof = step_profile.read_folder(folder)
        except step_profile.ProfileError as e:
            print(f"{e}: rank 0 profiles when --profile-dir is given (lab 9, step 4)")
            return None
        print(f"rank 0's trace: {prof.path}")
    else:
        found = profile_reference.read()
        if found is None:
            print("(no reference profile in this course)")
            return None
        ref, prof = found
        print(f"The course's reference: {ref.script} on {ref.workers} workers ({' '.join(ref.args)}), made on "
              f"{ref.made.date} on {ref.made.machine} by `{ref.made.command}`.")
    print(prof.summary())
    notebook.show(step_profile.figure(prof))
    return prof


def large_batch(script: str | None = None, batches: Sequence[int] = (64, 1024), epochs: int = 4) -> list[drawn.Point]:
    """Without ``script``: the course's large-batch experiment, a table and a picture. With ``script`` (once its
    Horovod lab passed step 8): every rule at ``batches`` images per worker, ``epochs`` epochs each, on this
    machine (in quick mode, one small run per rule, one epoch on tiny data)."""
    if script is not None and notebook.ready(script, "horovod", 8):
        quick = notebook.quick()
        plan = experiment.Plan(batches=(16,) if quick else tuple(batches), epochs=1 if quick else epochs)
        tiny = dict(zip(notebook.TINY[::2], notebook.TINY[1::2], strict=True))
        extra = [a for k, v in tiny.items() if k != "--batch-size" for a in (k, v)] if quick else []
        print(f"running {plan.size()} trainings of {script} on {plan.workers} workers, {plan.epochs} epoch(s) each; "
              "each is told as it ends ...", flush=True)
        points = experiment.sweep(Path(script), plan, extra=extra)
        where = f"{Path(script).name} on this machine"
    else:
        ref = experiment.read()
        if ref is None:
            print("(no reference results for the large-batch experiment in this course)")
            return []
        points = ref.points
        load = f", other programs {100 * ref.made.other_work:.0f}% of it" if ref.made.other_work is not None else ""
        where = (f"the course's reference: {ref.script} on {ref.workers} workers, {ref.epochs} epochs each, made on "
                 f"{ref.made.date} on {ref.made.machine}{load} (`{ref.made.command}`)")
    print(f"\nValidation accuracy (%) after the last epoch, {where}:")
    print(drawn.table(points))
    if points:
        notebook.show(drawn.figure(points))
    return points


ELASTIC_TIMEOUT = 600.0  # seconds for the elastic run on virtual nodes


def elastic_on_nodes(script: str, timeout: float = ELASTIC_TIMEOUT) -> ElasticRun | None:
    """Step 5's elastic run across the first 2 virtual nodes ``labkit nodes up`` started, one worker each: the second
    node is taken away once rank 0 finished a few epochs and given back; what the check makes of it."""
    if notebook.untouched(script):
        print(f"{Path(script).name} is still the starter: make it elastic (step 5) first.")
        return None
    problem = nodes_lab.why_not()
    if problem:
        print(f"Not run: {problem} Step 5's check ran the same exercise on this machine's slots.")
        return None
    cluster = VirtualNodes.load()
    if cluster is not None and len(cluster.nodes) < elastic_run.WORKERS:
        print(f"Not run: {len(cluster.nodes)} virtual node is up and a node must leave: `labkit nodes down`, then "
              "`labkit nodes up` (2 nodes) as root, and run this cell again.")
        return None
    if cluster is None:
        print("No virtual nodes are up: start two as root (`labkit nodes up`, lab 7) and run this cell again; "
              "`labkit nodes down` when you are done. Step 5's check ran the same exercise on this machine's slots.")
        return None
    with tempfile.TemporaryDirectory(prefix="labkit-elastic-") as tmp:
        print(f"running {Path(script).name} with --elastic on {cluster.nodes[0].name} and {cluster.nodes[1].name}; "
              f"{cluster.nodes[1].name} leaves and comes back (a minute or two) ...", flush=True)
        try:
            run = elastic_run.run(Path(script).resolve(), Path(tmp), timeout, hostfile=cluster.hostfile)
        except (ValueError, LaunchError) as e:
            print(f"Not run: {e}")
            return None
    try:
        print("It worked: " + elastic_judge.judge(run))
    except Failed as e:
        print(f"Not yet: {e}")
    return run
