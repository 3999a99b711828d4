"""Step 7 of the Horovod lab: checkpoints written by rank 0 only, and a second run that resumes from them
(the weights restored everywhere, the epoch broadcast from rank 0)."""

from __future__ import annotations

from labkit.check import hvd_runs as hr
from labkit.check.verdict import Failed
from labkit.records.hvd_evidence import HorovodEvidence, Run

CHECKPOINT_DIR = "checkpoints"  # the folder the check gives the script (--checkpoint-dir)
CHECKPOINT_ARGS = ["--checkpoint-dir", CHECKPOINT_DIR]
RESTORE = ("Restore the checkpoint's weights on rank 0 into the model every rank built and compiled with "
           "DistributedOptimizer: `model.load_weights(path)`; BroadcastGlobalVariablesCallback(0) gives them to "
           "the other ranks.")


def _resume_runs(ev: HorovodEvidence) -> tuple[Run, Run | None]:
    if ev.resume is None:
        raise Failed("the checkpoint runs did not happen: steps 1-6 must pass first.")
    first = ev.resume.first
    logs = " ".join(i.log_tail + i.error for i in first.ranks.values())
    if hr.ignored(first, "--checkpoint-dir") or ("unrecognized arguments" in logs and "--checkpoint-dir" in logs):
        raise Failed("the check runs your script with `--checkpoint-dir DIR` (the lab's command line): add that "
                     "argument, default '' for no checkpoints.")
    return first, ev.resume.second


def _on_other_disk(why: str) -> str:
    """``why`` a rank crashed, with the reason when it looked for rank 0's checkpoint."""
    if "checkpoint" in why.lower() or "no such file" in why.lower() or "unable to open" in why.lower():
        why += (" Only rank 0 saved the checkpoint, so only rank 0's disk has it (the check gives each rank a "
                "folder of its own, as separate nodes have): load it on rank 0 and let "
                "BroadcastGlobalVariablesCallback(0) give the other ranks its weights.")
    return why


def step_7(ev: HorovodEvidence) -> str:
    first, second = _resume_runs(ev)
    hr.need(first, "train_end")
    saves = {r: [s for s in first.state(r).saves if s.in_fit] for r in range(first.np)}
    if not saves[0]:
        raise Failed(f"with `--checkpoint-dir {CHECKPOINT_DIR}` rank 0 saved no checkpoint during training: append "
                     "`tf.keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "
                     "'checkpoint-{epoch}.h5'))` to the callbacks on rank 0.")
    others = [r for r in saves if r and saves[r]]
    if others:
        raise Failed(f"rank {others[0]} saved checkpoints too ({saves[others[0]][0].path}): on a shared disk the "
                     "ranks would overwrite each other's files. Add ModelCheckpoint only when hvd.rank() == 0.")
    if second is None:
        raise Failed("the second run (which should resume) did not happen.")
    try:
        hr.need(second, "batch1_end")
    except Failed as e:
        opts = {r: (second.states[r].fit[0].optimizer if second.states[r].fit else None) or ""
                for r in range(second.np) if r in second.states}
        if len({"horovod" in o for o in opts.values()}) > 1:
            raise Failed("in the resumed run rank 0's optimizer no longer averaged gradients (a plain "
                         f"{opts.get(0, '?').rsplit('.', 1)[-1]} from the loaded model), so the ranks waited for each "
                         f"other. {RESTORE}") from None
        if "HorovodBroadcast" in str(e):
            raise Failed("in the resumed run the broadcast of rank 0's variables failed: Horovod matches variables by "
                         "name, and a model loaded whole brings optimizer variables named unlike the other ranks' "
                         f"fresh ones. {RESTORE}") from None
        raise Failed(_on_other_disk(str(e))) from None
    saved_epochs = len(first.state(0).epochs)
    starts = [(second.state(r).fit[0].initial_epoch or 0) for r in range(second.np)]
    if starts[0] != saved_epochs:
        raise Failed(f"the second run started at epoch {starts[0]} although rank 0 had saved a checkpoint after epoch "
                     f"{saved_epochs}: find the latest checkpoint-<epoch> file and pass `initial_epoch=<its epoch>` "
                     "to fit().")
    late = [r for r, e in enumerate(starts) if e != starts[0]]
    if late:
        raise Failed(f"rank {late[0]} started at epoch {starts[late[0]]} while rank 0 resumed at epoch {starts[0]}: "
                     "rank 1 cannot see rank 0's checkpoint (on a cluster it is on rank 0's disk; the check gives each "
                     "rank a folder of its own). Broadcast the epoch rank 0 found: "
                     "`resume_from_epoch = hvd.broadcast(resume_from_epoch, 0, name='resume_from_epoch')`.")
    saved, resumed = hr.weights(first, 0).get("final"), hr.weights(second, 0).get("init")
    if saved is None or resumed is None or hr.rel(saved, resumed) > 1e-5:
        raise Failed(f"rank 0 resumed at epoch {starts[0]} but not from the checkpoint's weights. {RESTORE}")
    upd = {r: hr.weights(second, r)["b1_end"] - hr.weights(second, r)["b1_begin"] for r in range(second.np)}
    if hr.rel(upd[0], upd[1]) > 1e-3:
        raise Failed("after resuming, the ranks applied different weight updates: the optimizer rank 0 trains with "
                     f"does not average gradients. {RESTORE}")
    finals = [hr.weights(second, r).get("final") for r in range(second.np)]
    if not hr.reached(second, "train_end") or hr.rel(finals[0], finals[1]) > 1e-4:
        raise Failed("after resuming, the ranks ended with different weights: keep "
                     "`BroadcastGlobalVariablesCallback(0)` so every rank gets the weights rank 0 loaded.")
    return (f"only rank 0 saved checkpoints; a second run resumed at epoch {starts[0]} on every rank, from the "
            "checkpoint's weights, still averaging gradients.")
