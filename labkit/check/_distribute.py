"""Behaviour checks of the tf.distribute labs: mirrored, multiworker, parameter-server.

Each check runs the learner's script under :mod:`labkit.dprobe` on a tiny slice
of data (a cluster of processes for the multi-worker labs) and judges what the
processes did: replicas, variables, batches, files written, epochs resumed.
The source is never read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit import cluster, contract, labs, launchers, output, proc
from labkit.check import Report, StepResult

TRAIN, TEST, BATCH = 256, 128, 16
COMMON = ["--train-size", str(TRAIN), "--test-size", str(TEST), "--batch-size", str(BATCH),
          "--val-batch-size", str(BATCH), "--widen-factor", "1", "--mode", "small", "--target-accuracy", "2"]


class _Failed(Exception):
    """A step failed; the message says what to change."""


STEPS = {name: labs.get(name).n_steps for name in ("mirrored", "multiworker", "parameter-server")}
# (lab, script digest, last step judged) -> results: an unchanged script is not run again in this process.
_CACHE: dict[tuple[str, str, int], list[StepResult]] = {}



def _check_global_batch(f: dict, global_batch: int, who: str) -> int | None:
    """Each replica got --batch-size examples and steps_per_epoch covers the data once; returns it."""
    b = f.get("batches") or {}
    if not b.get("per_replica_batch"):
        raise _Failed(f"could not sample the batches ({f.get('batches_error') or b.get('note')}): "
                      "pass a tf.data.Dataset to fit")
    sizes = {s for row in b["per_replica_batch"] for s in row}
    if sizes != {BATCH}:
        raise _Failed(f"{who} received batches of {sorted(sizes)} examples but --batch-size is {BATCH} per replica: "
                      "batch the dataset by the global batch, batch_size * strategy.num_replicas_in_sync "
                      "(the strategy splits it over the replicas)")
    spe = f.get("steps_per_epoch")
    if spe and not (TRAIN * 0.9 <= spe * global_batch <= TRAIN + global_batch):
        raise _Failed(f"steps_per_epoch={spe} with a global batch of {global_batch} is {spe * global_batch} "
                      f"examples per epoch for {TRAIN} training images: compute it from the global batch")
    return spe


def check(lab: str, script: Path, step: int, timeout: float = 180, **kw: Any) -> Report:
    """Run ``script`` for ``lab`` and judge steps 1..``step`` (``fresh=True`` ignores earlier results)."""
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"{script} does not exist")
    start = time.perf_counter()
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    cached = _cached(lab, digest, step) if not kw.get("fresh") else None
    if cached is not None:
        return Report(lab, str(script), cached, time.perf_counter() - start)
    # One run judges every step it can: the multi-worker kill-and-resume run is only made for step 4.
    upto = STEPS[lab] if lab != "multiworker" or step >= 4 else 3
    work = Path(tempfile.mkdtemp(prefix=f"labkit-check-{lab}-"))
    try:
        judges = {"multiworker": _multiworker, "mirrored": _mirrored, "parameter-server": _parameter_server}[lab]
        steps = judges(script.resolve(), upto, timeout, work, **kw)
    finally:
        if not kw.get("keep"):
            shutil.rmtree(work, ignore_errors=True)
    _CACHE[(lab, digest, upto)] = steps
    return Report(lab, str(script), steps[:step], time.perf_counter() - start)


def _cached(lab: str, digest: str, step: int) -> list[StepResult] | None:
    for (lab_, digest_, upto), steps in _CACHE.items():
        if (lab_, digest_) != (lab, digest):
            continue
        if upto >= step:
            return steps[:step]
        failed = next((r.step for r in steps if not r.passed), None)
        if failed is not None:  # later steps cannot pass before this one is fixed
            return steps + [StepResult(k, False, f"not checked: fix step {failed} first") for k in range(upto + 1,
                                                                                                        step + 1)]
    return None


def _judge(step: int, checks: list[Callable[[], str]], run_error: str | None = None) -> list[StepResult]:
    """Run step checks 1..step in order; after the first failure the rest are not judged."""
    results: list[StepResult] = []
    for k, fn in enumerate(checks[:step], 1):
        if any(not r.passed for r in results):
            first = next(r.step for r in results if not r.passed)
            results.append(StepResult(k, False, f"not checked: fix step {first} first"))
            continue
        try:
            results.append(StepResult(k, True, fn()))
        except _Failed as e:
            msg = str(e)
            if run_error:
                msg += f"\nThe run failed:\n{run_error}"
            results.append(StepResult(k, False, msg))
    return results


def _records(probe: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for f in sorted(probe.glob("*.json")):
        try:
            out[f.stem] = json.loads(f.read_text())
        except ValueError:
            continue
    return out


def _events(probe: Path, task: str) -> list[dict[str, Any]]:
    path = probe / f"{task}.events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tail(text: str, lines: int = 12) -> str:
    return output.error_tail(text, lines)


def _fit(rec: dict[str, Any], who: str) -> dict[str, Any]:
    if rec.get("error"):
        raise _Failed(f"{who} stopped with an error: {rec['error'][-600:]}")
    if not rec.get("fits"):
        raise _Failed(f"{who} never called model.fit(...)")
    return rec["fits"][-1]


def _files(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- multiworker

WORKERS = 2


def _multiworker(script: Path, step: int, timeout: float, work: Path, **kw: Any) -> list[StepResult]:
    probe = work / "probe"
    epochs = 3 if step >= 4 else 2
    cmd = [sys.executable, "-m", "labkit.dprobe", str(probe), "--", str(script), *COMMON,
           "--epochs", str(epochs), "--backup-dir", str(work / "backup"),
           "--model-path", "saved/model.keras", "--log-dir", "logs"]
    c = cluster.Cluster(cmd, workers=WORKERS, log_dir=work / "logs", record=False,
                        task_cwd=lambda t, i: work / f"{t}{i}",
                        quiet=True, env={contract.PROBE_LOAD: "saved/model.keras"})
    kill: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    with c:
        c.start()
        if step >= 4:
            kill = _kill_and_restart(c, probe, deadline)
        result = c.wait(max(5.0, deadline - time.monotonic()))
    recs = _records(probe)
    run_error = None
    if not result.ok:
        run_error = result.summary()[-1500:]
    names = [f"worker.{i}" for i in range(WORKERS)]

    def records() -> list[dict[str, Any]]:
        missing = [n for n in names if n not in recs]
        if missing:
            raise _Failed(f"{', '.join(missing)} did not get to training"
                          + (" (the run timed out)" if result.timed_out else ""))
        return [recs[n] for n in names]

    def step1() -> str:
        fits = [_fit(r, n) for r, n in zip(records(), names, strict=True)]
        for n, r, f in zip(names, records(), fits, strict=True):
            made = [s["class"] for s in r.get("strategies", [])]
            if f["replicas"] == 1 and not made:
                raise _Failed(f"{n} trained alone (1 replica, no strategy): create "
                              "tf.distribute.MultiWorkerMirroredStrategy() at the start of main()")
            if f["strategy"] != "CollectiveAllReduceStrategy":
                raise _Failed(f"{n}'s model belongs to {f['strategy']}, not the MultiWorkerMirroredStrategy "
                              f"(strategies created: {', '.join(made) or 'none'}): build and compile the model "
                              "inside `with strategy.scope():`")
            if f["replicas"] != WORKERS:
                raise _Failed(f"{n} had num_replicas_in_sync={f['replicas']} but the cluster has {WORKERS} workers: "
                              "create the strategy first thing in main(), so that it reads TF_CONFIG")
            if not any("Mirrored" in t for t in f["variables"]["types"]):
                raise _Failed(f"{n}'s variables are {f['variables']['types']}, not MirroredVariables: "
                              "create the model inside strategy.scope()")
        digests = {f.get("weights") for f in fits}
        if len(digests) != 1 or None in digests:
            raise _Failed("the workers finished with different weights: they did not train one model together")
        return (f"both workers joined one MultiWorkerMirroredStrategy (num_replicas_in_sync={WORKERS}); "
                "variables are MirroredVariables and identical on every worker after training")

    def step2() -> str:
        fits = [_fit(r, n) for r, n in zip(records(), names, strict=True)]
        global_batch = BATCH * WORKERS
        spe = [_check_global_batch(f, global_batch, f"each replica of {n}")
               for n, f in zip(names, fits, strict=True)][0]
        seen = [{x for batch in f["batches"]["ids"] for replica in batch for x in replica} for f in fits]
        common = seen[0] & seen[1]
        if len(common) > 0.1 * min(len(s) for s in seen):
            raise _Failed(f"workers 0 and 1 trained on the same examples ({len(common)} of {len(seen[0])} shared in "
                          "their first batches): each worker needs its own shard. With AutoShardPolicy.DATA every "
                          "worker must shuffle in the same order (one seed); or shard the data yourself "
                          "(data.dataset(..., shard=(workers, index))) and set the policy to OFF")
        return (f"each replica gets {BATCH} examples per step (global batch {global_batch}), "
                f"steps_per_epoch={spe} covers the data once, and the workers' shards do not overlap")

    def step3() -> str:
        recs_ = records()
        for n, r in zip(names, recs_, strict=True):
            if r.get("exit") not in (0, None) or r.get("error"):
                raise _Failed(f"{n} failed: {r.get('error', 'exit ' + str(r.get('exit')))}")
            if not r.get("saves"):
                raise _Failed(f"{n} never called model.save: in multi-worker training every worker saves "
                              "(saving may need all workers); non-chief workers save to a temporary path")
        chief_files = _files(work / "worker0")
        if "saved/model.keras" not in chief_files:
            raise _Failed(f"the chief did not write --model-path (saved/model.keras) in its folder; it wrote "
                          f"{chief_files or 'nothing'}")
        load = recs_[0].get("load") or {}
        if not load.get("ok") or not load.get("same_weights"):
            raise _Failed(f"the chief's saved model does not reload with the trained weights: {load}")
        other = _files(work / "worker1")
        if other:
            raise _Failed(f"worker 1 left {', '.join(other[:5])} behind: only the chief keeps the model and logs; "
                          "non-chief workers save to a temporary folder (e.g. workertemp_1) and delete it")
        out1 = (work / "logs" / "worker.1.log").read_text(errors="replace")
        if "Epoch 1/" in out1:
            raise _Failed("worker 1 printed the progress bar too: set verbose=0 on all workers but the chief")
        return ("every worker saved; only the chief's model (which reloads with the trained weights) and logs "
                "remain; worker 1 cleaned up its temporary copy and printed nothing")

    def step4() -> str:
        if not kill.get("killed"):
            raise _Failed(f"could not kill a worker mid-training: {kill.get('why', 'training ended first')}")
        ev = _events(probe, "worker.0")
        pids = list(dict.fromkeys(e["pid"] for e in ev))
        if len(pids) < 2:
            raise _Failed("the chief did not train again after the restart")
        first = [e for e in ev if e["pid"] == pids[0]]
        last = [e for e in ev if e["pid"] == pids[-1]]
        done = sorted({e["epoch"] for e in first if e["kind"] == "epoch_end"})
        again = sorted({e["epoch"] for e in last if e["kind"] == "epoch_begin"})
        if not again:
            raise _Failed("after the restart the chief began no epoch")
        repeated = sorted(set(done) & set(again))
        if repeated:
            raise _Failed(f"worker 1 was killed after epoch(s) {[d + 1 for d in done]} had completed, and the "
                          f"restarted cluster trained epoch(s) {[r + 1 for r in repeated]} again: add "
                          "tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir) to the callbacks")
        ended = {e["epoch"] for e in last if e["kind"] == "epoch_end"}
        if not any(e["kind"] == "fit_end" for e in last) or max(ended, default=-1) != epochs - 1:
            raise _Failed("after the restart training did not finish all epochs")
        return (f"worker 1 was killed during epoch {kill['epoch'] + 1}; after the restart training resumed at epoch "
                f"{again[0] + 1} (epochs {[d + 1 for d in done]} were not repeated) and finished")

    return _judge(step, [step1, step2, step3, step4], run_error)


def _kill_and_restart(c: cluster.Cluster, probe: Path, deadline: float) -> dict[str, Any]:
    """Kill worker 1 once the chief has begun its second epoch; restart whatever died."""
    while time.monotonic() < deadline - 30:
        begun = [e for e in _events(probe, "worker.0") if e["kind"] == "epoch_begin" and e["epoch"] >= 1]
        if begun:
            break
        if not all(t.alive() for t in c.tasks.values()):
            return {"killed": False, "why": "a worker exited before its second epoch"}
        time.sleep(0.2)
    else:
        return {"killed": False, "why": "the second epoch did not begin in time"}
    c.kill_task("worker", 1, signal.SIGKILL)
    # The survivors notice the lost peer and stop (a collective fails); give them a moment.
    end = time.monotonic() + 25
    while time.monotonic() < end and c.tasks[("worker", 0)].alive():
        time.sleep(0.2)
    restarted = c.restart_dead()
    return {"killed": True, "epoch": begun[0]["epoch"], "restarted": restarted}


# ----------------------------------------------------------------------------- mirrored

DEVICES = 2


def run_single(cmd: list[str], timeout: float, log: Path, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> tuple[int, bool]:
    """Run one process through the process layer; everything it started is stopped at the end."""
    with proc.Job() as job:
        p = job.spawn(cmd, env={**launchers.worker_env(1), **(env or {}), "PYTHONUNBUFFERED": "1"}, cwd=cwd,
                      log=log)
        code = p.wait(timeout)
    return (code if code is not None else p.returncode or -9), code is None


def _mirrored(script: Path, step: int, timeout: float, work: Path, **kw: Any) -> list[StepResult]:
    probe = work / "probe"
    model_path = work / "saved" / "model.keras"
    cmd = [sys.executable, "-m", "labkit.dprobe", str(probe), "--", str(script), *COMMON, "--epochs", "1",
           "--devices", str(DEVICES), "--model-path", str(model_path), "--log-dir", str(work / "logs")]
    log = work / "output.log"
    code, timed_out = run_single(cmd, timeout, log, {contract.PROBE_LOAD: str(model_path)}, cwd=work)
    rec = _records(probe).get("local.0", {})
    run_error = None
    if code != 0 or timed_out:
        run_error = ("timed out" if timed_out else f"exit code {code}") + "\n" + _tail(log.read_text(errors="replace"))

    def fit() -> dict[str, Any]:
        if not rec:
            raise _Failed("the script did not get to training")
        return _fit(rec, "the script")

    def step1() -> str:
        made = [s for s in rec.get("strategies", []) if s["class"].startswith("Mirrored")]
        if not made:
            others = [s["class"] for s in rec.get("strategies", [])]
            raise _Failed("no tf.distribute.MirroredStrategy was created"
                          + (f" (only {', '.join(others)})" if others else "")
                          + ": split the CPU into --devices logical devices and create MirroredStrategy over them")
        n = made[-1].get("replicas")
        if n != DEVICES:
            raise _Failed(f"the MirroredStrategy has {n} replica(s) for --devices {DEVICES}: call "
                          "tf.config.set_logical_device_configuration on the CPU with --devices entries before "
                          "any tensor is created, then give MirroredStrategy those devices")
        return f"MirroredStrategy with {n} replicas in sync on {', '.join(made[-1].get('devices', []))}"

    def step2() -> str:
        f = fit()
        if not f["strategy"].startswith("Mirrored"):
            raise _Failed(f"the model belongs to {f['strategy']}: build and compile it inside "
                          "`with strategy.scope():` so that its variables are mirrored")
        v = f["variables"]
        if not any("Mirrored" in t for t in v["types"]) or v["copies"] != DEVICES:
            raise _Failed(f"the model's variables are {v['types']} with {v['copies']} copies; expected "
                          f"MirroredVariables with {DEVICES} copies: create the model in the strategy's scope")
        after = f.get("after") or {}
        if after.get("replicas_equal") is not True:
            raise _Failed("after training the copies of the variables differ between replicas")
        return f"variables are MirroredVariables with {DEVICES} copies, identical on every replica after training"

    def step3() -> str:
        f = fit()
        gb = BATCH * DEVICES
        spe = _check_global_batch(f, gb, "each replica")
        return f"the global batch of {gb} is split into {DEVICES} x {BATCH}; steps_per_epoch={spe}"

    def step4() -> str:
        if not model_path.exists():
            raise _Failed(f"nothing was saved to --model-path ({model_path.name}): call model.save(args.model_path)")
        load = rec.get("load") or {}
        if not load.get("ok"):
            raise _Failed(f"the saved model does not load: {load.get('error')}")
        if not load.get("same_weights"):
            raise _Failed("the saved model's weights differ from the trained ones: save after training")
        return "the saved model reloads with the trained weights"

    return _judge(step, [step1, step2, step3, step4], run_error)


def _parameter_server(script: Path, step: int, timeout: float, work: Path, **kw: Any) -> list[StepResult]:
    probe = work / "probe"
    epochs = 2
    cmd = [sys.executable, "-m", "labkit.dprobe", str(probe), "--", str(script), *COMMON, "--epochs", str(epochs),
           "--log-dir", str(work / "logs")]
    c = cluster.Cluster(cmd, workers=2, ps=1, chief=True, log_dir=work / "tasks", quiet=True, record=False)
    with c:
        c.start()
        result = c.wait(timeout)
    recs = _records(probe)
    run_error = None if result.ok else result.summary()[-1500:]
    spe = -(-TRAIN // BATCH)

    def chief() -> dict[str, Any]:
        if "chief.0" not in recs:
            raise _Failed("the chief did not start the script" + (" (timed out)" if result.timed_out else ""))
        return recs["chief.0"]

    def step1() -> str:
        for name in ("worker.0", "worker.1", "ps.0"):  # a server that stopped serving explains the rest
            r = recs.get(name)
            if r is not None and r.get("exit") is not None and not r.get("fits"):
                raise _Failed(f"{name} exited (code {r['exit']}) instead of serving until the cluster stops: "
                              "start a tf.distribute.Server for it and call server.join()")
        rec = chief()
        made = [s["class"] for s in rec.get("strategies", [])]
        if not any(m.startswith("ParameterServerStrategy") for m in made):
            raise _Failed("the chief created no tf.distribute.ParameterServerStrategy"
                          + (f" (only {', '.join(made)})" if made else "")
                          + ": build it from tf.distribute.cluster_resolver.TFConfigClusterResolver()")
        for name in ("worker.0", "worker.1", "ps.0"):
            r = recs.get(name)
            if r is None:
                raise _Failed(f"{name} did not start")
            if r.get("fits"):
                raise _Failed(f"{name} trained a model itself: workers and parameter servers only serve; start a "
                              "tf.distribute.Server for them and join() it, and let the chief train")
        return "the chief created a ParameterServerStrategy; workers and the parameter server served until stopped"

    def step2() -> str:
        rec = chief()
        if rec.get("fits"):
            f = _fit(rec, "the chief")
            devices = f["variables"]["devices"]
            if not f["strategy"].startswith("ParameterServerStrategy"):
                raise _Failed(f"the model belongs to {f['strategy']}: build and compile it inside "
                              "`with strategy.scope():`")
        else:  # a custom training loop: the variables created under the strategy
            if rec.get("error"):
                raise _Failed(f"the chief stopped with an error: {rec['error'][-600:]}")
            devices = sorted(rec.get("ps_variable_devices") or {})
            if not devices:
                raise _Failed("no variable was created under the ParameterServerStrategy: create the model (and "
                              "optimizer) inside `with strategy.scope():`")
        if not devices or not all("/job:ps" in d for d in devices):
            raise _Failed(f"the model's variables are on {devices[:3]}, not on the parameter server: "
                          "create the model inside strategy.scope()")
        return f"every model variable lives on the parameter server ({devices[0]})"

    def step3() -> str:
        rec = chief()
        co = rec.get("coordinator") or {}
        if rec.get("error"):
            raise _Failed(f"the chief stopped with an error: {rec['error'][-600:]}")
        if not co.get("created") or co.get("scheduled", 0) < epochs * spe:
            raise _Failed(f"the ClusterCoordinator scheduled {co.get('scheduled', 0)} steps, expected at least "
                          f"{epochs * spe}: train with model.fit(..., steps_per_epoch=...) or coordinator.schedule")
        f = rec["fits"][-1] if rec.get("fits") else {}
        if f.get("iterations") is not None and f["iterations"] < epochs * spe:
            raise _Failed(f"only {f['iterations']} of {epochs * spe} scheduled steps updated the variables")
        per_worker = co.get("per_worker_datasets") or []
        if not per_worker:
            raise _Failed("no worker built its own input pipeline: give fit a tf.data.Dataset or a "
                          "DatasetCreator, or in a custom loop use coordinator.create_per_worker_dataset(dataset_fn)")
        if f.get("dataset_fn_calls") == []:
            raise _Failed("the dataset function given to DatasetCreator was never called")
        updates = f" (variables updated {f['iterations']} times)" if f.get("iterations") is not None else ""
        return (f"a ClusterCoordinator ran {co.get('scheduled')} steps on the workers{updates}; each worker builds "
                f"its own input pipeline ({', '.join(sorted(set(per_worker)))})")

    return _judge(step, [step1, step2, step3], run_error)
