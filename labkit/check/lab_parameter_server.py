"""The ParameterServerStrategy lab's three steps, judged from a probed cluster
(a chief, 2 workers, 1 parameter server) training for 2 epochs."""

from __future__ import annotations

from pathlib import Path

from labkit.check import ending, tfdist
from labkit.check.verdict import Failed
from labkit.launching.jobspec import JobSpec
from labkit.records import evidence as saved
from labkit.records.tfdist_evidence import ParameterServer
from labkit.records.tfdist_probe import Fit, Task
from labkit.tfdist import cluster
from labkit.tfdist.cluster import Tasks

SERVERS = ("worker.0", "worker.1", "ps.0")
EVIDENCE = ParameterServer  # what collect returns and the judges read (labkit.check.judging saves and loads it)
evidence = saved.from_json(EVIDENCE)  # the evidence from its JSON, every field checked (how a test builds one)


def collect(script: Path, upto: int, timeout: float, work: Path) -> ParameterServer:
    """Run the cluster under the probe; it ends when the chief does, or at once when a server returns."""
    epochs = 2
    cmd = tfdist.probe_command(work / "probe", script, "--epochs", str(epochs), "--log-dir", str(work / "logs"))
    c = cluster.Cluster(cmd, tasks=Tasks(workers=2, ps=1, chief=True),
                        job=JobSpec(log_dir=work / "tasks", quiet=True, record=False))
    with c:
        c.start()
        result = c.wait(timeout)
    unreadable: list[str] = []
    records = tfdist.records(work / "probe", unreadable)
    return ParameterServer(
        lab="parameter-server", epochs=epochs, steps_per_epoch=-(-tfdist.TRAIN // tfdist.BATCH), records=records,
        timed_out=result.timed_out,
        run_error=None if result.ok else result.summary()[-1500:] + _where(work / "probe", result.timed_out, timeout),
        unreadable=unreadable[0] if unreadable else None)


def _where(probe: Path, timed_out: bool, timeout: float) -> str:
    """On a timeout, where the chief was when it was stopped."""
    if not timed_out:
        return ""
    where = ending.still_running(probe, "chief.0", "labkit/instrument/start.py", timeout)
    return "\nthe chief: " + ending.where_text(where)


def _chief(ev: ParameterServer) -> Task:
    if "chief.0" not in ev.records:
        raise Failed("the chief did not start the script" + (" (timed out)" if ev.timed_out else ""))
    return ev.records["chief.0"]


def step_1(ev: ParameterServer) -> str:
    recs = ev.records
    for name in SERVERS:  # a server that stopped serving explains the rest
        r = recs.get(name)
        if r is not None and r.exit is not None and not r.fits:
            raise Failed(f"{name} exited (code {r.exit}) instead of serving until the cluster stops: "
                         "start a tf.distribute.Server for it and call server.join()")
    made = [s.cls for s in _chief(ev).strategies]
    if not any(m.startswith("ParameterServerStrategy") for m in made):
        raise Failed("the chief created no tf.distribute.ParameterServerStrategy"
                     + (f" (only {', '.join(made)})" if made else "")
                     + ": build it from tf.distribute.cluster_resolver.TFConfigClusterResolver()")
    for name in SERVERS:
        r = recs.get(name)
        if r is None:
            raise Failed(f"{name} did not start")
        if r.fits:
            raise Failed(f"{name} trained a model itself: workers and parameter servers only serve; start a "
                         "tf.distribute.Server for them and join() it, and let the chief train")
    return "the chief created a ParameterServerStrategy; workers and the parameter server served until stopped"


def step_2(ev: ParameterServer) -> str:
    rec = _chief(ev)
    if rec.fits:
        f = tfdist.last_fit(rec, "the chief")
        devices = f.variables.devices
        if not f.strategy.startswith("ParameterServerStrategy"):
            raise Failed(f"the model belongs to {f.strategy}: build and compile it inside "
                         "`with strategy.scope():`")
    else:  # a custom training loop: the variables created under the strategy
        if rec.error:
            raise Failed(f"the chief stopped with an error: {rec.error[-600:]}")
        devices = sorted(rec.ps_variable_devices)
        if not devices:
            raise Failed("no variable was created under the ParameterServerStrategy: create the model (and "
                         "optimizer) inside `with strategy.scope():`")
    if not devices or not all("/job:ps" in d for d in devices):
        raise Failed(f"the model's variables are on {devices[:3]}, not on the parameter server: "
                     "create the model inside strategy.scope()")
    return f"every model variable lives on the parameter server ({devices[0]})"


def step_3(ev: ParameterServer) -> str:
    rec = _chief(ev)
    want = ev.epochs * ev.steps_per_epoch
    co = rec.coordinator
    if rec.error:
        raise Failed(f"the chief stopped with an error: {rec.error[-600:]}")
    if not co.created or co.scheduled < want:
        raise Failed(f"the ClusterCoordinator scheduled {co.scheduled} steps, expected at least "
                     f"{want}: train with model.fit(..., steps_per_epoch=...) or coordinator.schedule")
    f = rec.fits[-1] if rec.fits else Fit()
    if f.iterations is not None and f.iterations < want:
        raise Failed(f"only {f.iterations} of {want} scheduled steps updated the variables")
    per_worker = co.per_worker_datasets
    if not per_worker:
        raise Failed("no worker built its own input pipeline: give fit a tf.data.Dataset or a "
                     "DatasetCreator, or in a custom loop use coordinator.create_per_worker_dataset(dataset_fn)")
    if f.dataset_fn_calls == []:
        raise Failed("the dataset function given to DatasetCreator was never called")
    updates = f" (variables updated {f.iterations} times)" if f.iterations is not None else ""
    return (f"a ClusterCoordinator ran {co.scheduled} steps on the workers{updates}; each worker builds "
            f"its own input pipeline ({', '.join(sorted(set(per_worker)))})")


STEPS = [step_1, step_2, step_3]
