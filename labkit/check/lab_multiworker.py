"""The MultiWorkerMirroredStrategy lab's five steps, judged from a probed 2-worker cluster.

Steps 1-3 need one run of 2 epochs. Step 4 needs a run of 3 epochs in which worker 1
is killed once the chief has begun its second epoch, and the dead workers restarted.
Step 5 (the learning rate) makes that run longer (``LR_EPOCHS``) and gives it ``--base-lr``;
:mod:`labkit.check.lr_rule` judges the rate each worker used at every batch.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from labkit.check import lr_rule, tfdist
from labkit.check.verdict import Failed
from labkit.core import contract, proc
from labkit.launching.jobspec import JobSpec
from labkit.records import evidence as saved
from labkit.records import tfdist_probe
from labkit.records.tfdist_evidence import Kill, MultiWorker
from labkit.records.tfdist_probe import Event, Fit, Task
from labkit.tfdist import cluster
from labkit.tfdist.cluster import Tasks

WORKERS = 2
EVIDENCE = MultiWorker  # what collect returns and the judges read (labkit.check.judging saves and loads it)
evidence = saved.from_json(EVIDENCE)  # the evidence from its JSON, every field checked (how a test builds one)
MODEL = "saved/model.keras"
BASE_LR, LR_EPOCHS = 0.02, 6  # --base-lr unlike any mode's default; epochs enough for a 5-epoch warm-up
WORDS = lr_rule.Words(
    "worker", "replicas", "strategy.num_replicas_in_sync",
    "`base_lr = args.base_lr * strategy.num_replicas_in_sync` for the optimizer",
    "`tf.keras.callbacks.LearningRateScheduler(lr_schedule(base_lr, args.warmup_epochs, start_lr=args.base_lr))` "
    "(or a LearningRateSchedule with a warm-up)")


def upto(step: int) -> int:
    """The kill-and-resume run is only made when step 4 is asked for; step 5 makes it longer."""
    return min(step, 5) if step >= 4 else 3


def collect(script: Path, upto: int, timeout: float, work: Path) -> MultiWorker:
    """Run a 2-worker cluster under the probe (killing and restarting worker 1 when step 4 is judged)."""
    probe = work / "probe"
    epochs = LR_EPOCHS if upto >= 5 else 3 if upto >= 4 else 2
    lr = ["--base-lr", str(BASE_LR)] if upto >= 5 else []
    cmd = tfdist.probe_command(probe, script, "--epochs", str(epochs), "--backup-dir", str(work / "backup"),
                               "--model-path", MODEL, "--log-dir", "logs", *lr)
    c = cluster.Cluster(cmd, tasks=Tasks(workers=WORKERS, task_cwd=lambda t, i: work / f"{t}{i}"),
                        job=JobSpec(log_dir=work / "logs", record=False, quiet=True, env={contract.PROBE_LOAD: MODEL}))
    kill = Kill()
    deadline = time.monotonic() + timeout
    with c:
        c.start()
        if upto >= 4:
            kill = _kill_and_restart(c, probe, deadline)
        result = c.wait(max(5.0, deadline - time.monotonic()))
    logs = {f"worker.{i}": work / "logs" / f"worker.{i}.log" for i in range(WORKERS)}
    unreadable: list[str] = []
    records = tfdist.records(probe, unreadable)
    events = {n: tfdist.events(probe, n, unreadable) for n in (f"worker.{i}" for i in range(WORKERS))}
    return MultiWorker(
        lab="multiworker", workers=WORKERS, batch=tfdist.BATCH, train=tfdist.TRAIN, epochs=epochs, model_path=MODEL,
        records=records, base_lr=BASE_LR if upto >= 5 else None, events=events,
        files={f"worker{i}": tfdist.files(work / f"worker{i}") for i in range(WORKERS)},
        progress_bar={n: p.exists() and "Epoch 1/" in p.read_text(errors="replace") for n, p in logs.items()},
        kill=kill, timed_out=result.timed_out, run_error=None if result.ok else result.summary()[-1500:],
        unreadable=unreadable[0] if unreadable else None)


def _kill_and_restart(c: cluster.Cluster, probe: Path, deadline: float) -> Kill:
    """Kill worker 1 once the chief has begun its second epoch; restart whatever died."""
    begun: list[Event] = []

    def second_epoch_or_exit() -> bool:
        begun[:] = [e for e in tfdist.events(probe, "worker.0")
                    if e.kind == "epoch_begin" and e.epoch is not None and e.epoch >= 1]
        return bool(begun) or not all(t.alive() for t in c.tasks.values())

    if not proc.wait_until(second_epoch_or_exit, max(0.0, deadline - 30 - time.monotonic())):
        return Kill(killed=False, why="the second epoch did not begin in time")
    if not begun:
        return Kill(killed=False, why="a worker exited before its second epoch")
    c.kill_task("worker", 1, signal.SIGKILL)
    # The survivors notice the lost peer and stop (a collective fails); give them a moment.
    proc.wait_until(lambda: not c.tasks[("worker", 0)].alive(), 25)
    restarted = c.restart_dead()
    return Kill(killed=True, epoch=begun[0].epoch, restarted=restarted)


def _names(ev: MultiWorker) -> list[str]:
    return [f"worker.{i}" for i in range(ev.workers)]


def _records(ev: MultiWorker) -> list[Task]:
    missing = [n for n in _names(ev) if n not in ev.records]
    if missing:
        raise Failed(f"{', '.join(missing)} did not get to training" + (" (the run timed out)" if ev.timed_out
                                                                         else ""))
    return [ev.records[n] for n in _names(ev)]


def _fits(ev: MultiWorker) -> list[Fit]:
    return [tfdist.last_fit(r, n) for r, n in zip(_records(ev), _names(ev), strict=True)]


def step_1(ev: MultiWorker) -> str:
    fits, n = _fits(ev), ev.workers
    for name, r, f in zip(_names(ev), _records(ev), fits, strict=True):
        made = [s.cls for s in r.strategies]
        if f.replicas == 1 and not made:
            raise Failed(f"{name} trained alone (1 replica, no strategy): create "
                         "tf.distribute.MultiWorkerMirroredStrategy() at the start of main()")
        if f.strategy != "CollectiveAllReduceStrategy":
            raise Failed(f"{name}'s model belongs to {f.strategy}, not the MultiWorkerMirroredStrategy "
                         f"(strategies created: {', '.join(made) or 'none'}): build and compile the model "
                         "inside `with strategy.scope():`")
        if f.replicas != n:
            raise Failed(f"{name} had num_replicas_in_sync={f.replicas} but the cluster has {n} workers: "
                         "create the strategy first thing in main(), so that it reads TF_CONFIG")
        if not any("Mirrored" in t for t in f.variables.types):
            raise Failed(f"{name}'s variables are {f.variables.types}, not MirroredVariables: "
                         "create the model inside strategy.scope()")
    digests = {f.weights for f in fits}
    if len(digests) != 1 or None in digests:
        raise Failed("the workers finished with different weights: they did not train one model together")
    return (f"both workers joined one MultiWorkerMirroredStrategy (num_replicas_in_sync={n}); "
            "variables are MirroredVariables and identical on every worker after training")


def step_2(ev: MultiWorker) -> str:
    fits, n, batch = _fits(ev), ev.workers, ev.batch
    spe = [tfdist.global_batch(f, batch, n, ev.train, f"each replica of {name}")
           for name, f in zip(_names(ev), fits, strict=True)][0]
    seen = [{x for b in (f.batches.ids if f.batches else []) for replica in b for x in replica} for f in fits]
    common = seen[0] & seen[1]
    if len(common) > 0.1 * min(len(s) for s in seen):
        raise Failed(f"workers 0 and 1 trained on the same examples ({len(common)} of {len(seen[0])} shared in "
                     "their first batches): each worker needs its own shard. With AutoShardPolicy.DATA every "
                     "worker must shuffle in the same order (one seed); or shard the data yourself "
                     "(dataset.shard(num_workers, worker_index)) and set the policy to OFF")
    return (f"each replica gets {batch} examples per step (global batch {batch * n}), "
            f"steps_per_epoch={spe} covers the data once, and the workers' shards do not overlap")


def step_3(ev: MultiWorker) -> str:
    recs = _records(ev)
    for name, r in zip(_names(ev), recs, strict=True):
        if r.exit not in (0, None) or r.error:
            raise Failed(f"{name} failed: {r.error or 'exit ' + str(r.exit)}")
        if not r.saves:
            raise Failed(f"{name} never called model.save: in multi-worker training every worker saves "
                         "(saving may need all workers); non-chief workers save to a temporary path")
    chief_files = ev.files.get("worker0", [])
    if ev.model_path not in chief_files:
        raise Failed(f"the chief did not write --model-path ({ev.model_path}) in its folder; it wrote "
                     f"{chief_files or 'nothing'}")
    load = recs[0].load or tfdist_probe.Load()
    if not load.ok or not load.same_weights:
        raise Failed(f"the chief's saved model does not reload with the trained weights: {load.error or load}")
    other = ev.files.get("worker1", [])
    if other:
        raise Failed(f"worker 1 left {', '.join(other[:5])} behind: only the chief keeps the model and logs; "
                     "non-chief workers save to a temporary folder (e.g. workertemp_1) and delete it")
    if ev.progress_bar.get("worker.1"):
        raise Failed("worker 1 printed the progress bar too: set verbose=0 on all workers but the chief")
    return ("every worker saved; only the chief's model (which reloads with the trained weights) and logs "
            "remain; worker 1 cleaned up its temporary copy and printed nothing")


def step_4(ev: MultiWorker) -> str:
    kill = ev.kill
    if not kill.killed:
        raise Failed(f"could not kill a worker mid-training: {kill.why or 'training ended first'}")
    ev0 = ev.events.get("worker.0", [])
    pids = list(dict.fromkeys(e.pid for e in ev0))
    if len(pids) < 2:
        raise Failed("the chief did not train again after the restart")
    first = [e for e in ev0 if e.pid == pids[0]]
    last = [e for e in ev0 if e.pid == pids[-1]]
    done = sorted({e.epoch for e in first if e.kind == "epoch_end" and e.epoch is not None})
    again = sorted({e.epoch for e in last if e.kind == "epoch_begin" and e.epoch is not None})
    if not again:
        raise Failed("after the restart the chief began no epoch")
    repeated = sorted(set(done) & set(again))
    if repeated:
        raise Failed(f"worker 1 was killed after epoch(s) {[d + 1 for d in done]} had completed, and the "
                     f"restarted cluster trained epoch(s) {[r + 1 for r in repeated]} again: add "
                     "tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir) to the callbacks")
    ended = {e.epoch for e in last if e.kind == "epoch_end" and e.epoch is not None}
    if not any(e.kind == "fit_end" for e in last) or max(ended, default=-1) != ev.epochs - 1:
        raise Failed("after the restart training did not finish all epochs")
    return (f"worker 1 was killed during epoch {(kill.epoch or 0) + 1}; after the restart training resumed at epoch "
            f"{again[0] + 1} (epochs {[d + 1 for d in done]} were not repeated) and finished")


def _rates(events: list[Event]) -> list[list[float | None]]:
    """The rate of each batch, epoch by epoch; an epoch begun again after a restart counts as last run."""
    by_epoch = {e.epoch: e.lr for e in sorted(events, key=lambda e: e.t) if e.kind == "epoch_end"}
    return [by_epoch[k] for k in sorted(by_epoch)]


def step_5(ev: MultiWorker) -> str:
    if not ev.base_lr:
        raise Failed("the learning-rate run did not happen: steps 1-4 must pass first.")
    rates = {name: _rates(ev.events.get(name, [])) for name in _names(ev)}
    done = len(rates["worker.0"])
    if done < ev.epochs:
        raise Failed(f"the chief ended {done} of the {ev.epochs} epochs the check asked for (--epochs "
                     f"{ev.epochs}), too few to see the warm-up end.")
    return lr_rule.judge(rates, ev.base_lr, _fits(ev)[0].replicas or 0, WORDS)


STEPS = [step_1, step_2, step_3, step_4, step_5]
