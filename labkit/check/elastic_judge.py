"""Lab 9's step 5 judged from its elastic run (:mod:`labkit.check.elastic_run`): that the job shrank when a slot was
taken away, went on from its last commit, took the returning worker in at rank 0's epoch, and trained every epoch.

Each call of ``fit`` is read as the job's last ``epochs - initial_epoch`` epochs, so both correct ways of counting
read the same: ``fit(initial_epoch=state.epoch, epochs=E)``, and Horovod's example, ``fit(epochs=E - state.epoch)``
with its ``UpdateEpochStateCallback``.
"""

from __future__ import annotations

from labkit.check.verdict import Failed
from labkit.records.hvd_probe import ElasticRun, ElasticWorker

ELASTIC = ("when args.elastic is set, keep the model, its optimizer and the epoch in "
           "`state = hvd.elastic.KerasState(model, epoch=...)` (build the optimizer first: "
           "`opt.build(model.trainable_variables)`), commit it with `hvd.elastic.CommitStateCallback(state)`, keep the "
           "epoch up to date at each epoch's end, and call fit from `state.epoch` inside a function decorated with "
           "`@hvd.elastic.run`")
EPOCH_STATE = ("tf.keras numbers the epochs of `fit(initial_epoch=state.epoch)` from state.epoch, and Horovod's "
               "UpdateEpochStateCallback adds state.epoch again: with initial_epoch, set the state's epoch yourself "
               "(`LambdaCallback(on_epoch_end=lambda epoch, logs: setattr(state, \"epoch\", epoch + 1))`); or keep the "
               "callback and call `fit(epochs=args.epochs - state.epoch)`, as Horovod's example does")


def _fit_of(w: ElasticWorker, t: float) -> int:
    """The index of the call of fit ``w`` was in at time ``t`` (the last one begun by then)."""
    return max((i for i, start in enumerate(w.fit_starts) if start <= t), default=0)


def _asked(w: ElasticWorker, i: int, epochs: int) -> int:
    """The epochs ``w``'s ``i``-th call of fit asked for (the job's, when it gave no number)."""
    return w.fit_epochs[i] if i < len(w.fit_epochs) and w.fit_epochs[i] else epochs


def _begins(w: ElasticWorker, i: int, epochs: int) -> int:
    """How many of the job's ``epochs`` were done when ``w``'s ``i``-th call of fit began, by what it asked for: a
    call runs ``epochs - initial_epoch`` epochs, the job's last ones (fit from ``state.epoch`` to the end, or
    ``epochs=total - state.epoch`` from 0, as Horovod's example has it)."""
    return epochs - _asked(w, i, epochs) + w.fits[i]


def _job_epochs(w: ElasticWorker, epochs: int) -> list[tuple[int, float]]:
    """Each epoch ``w`` finished as the job's epoch (1-based), with its end."""
    out = []
    for e, end in zip(w.epochs, w.epoch_ends, strict=False):
        out.append((epochs - _asked(w, _fit_of(w, end), epochs) + e, end))
    return out


def judge(el: ElasticRun) -> str:
    """What the elastic run shows, or :class:`Failed` with what to change."""
    first = [w for w in el.workers if w.fit_starts and (el.left is None or w.fit_starts[0] < el.left)]
    chief = next((w for w in first if w.rank == 0), None)
    if chief is None or el.left is None:
        raise Failed(f"with --elastic the job never finished {el.leave_after} epochs on 2 workers: {el.summary}")
    return _left(el, chief) + _returned(el, chief, {w.pid for w in first})


def _left(el: ElasticRun, chief: ElasticWorker) -> str:
    """That the job went on from its last commit when a worker left."""
    assert el.left is not None
    after = [i for i, start in enumerate(chief.fit_starts) if start > el.left]
    finished = _job_epochs(chief, el.epochs)
    if not after:
        done = len({e for e, end in finished if end <= el.left})
        if any(end > el.left for _, end in finished) and el.ok:
            raise Failed(f"the check took a worker's slot away after {done} epochs, and the job never shrank: every "
                         "worker trained on to the end. Horovod's elastic mode removes a worker when the script "
                         "commits its state, and goes on through the function `hvd.elastic.run` wraps: " + ELASTIC +
                         ".")
        raise Failed(f"when the check took a worker's slot away after {done} epochs, the job stopped "
                     f"({el.summary}): " + ELASTIC + ".")
    i = after[0]
    done = len({e for e, end in finished if end <= chief.fit_starts[i]})
    begins = _begins(chief, i, el.epochs)
    if begins < done - 1:  # one epoch may be redone: the last commit can precede its end
        raise Failed(f"when a worker left after {done} epochs, rank 0 trained again from epoch {begins + 1}: the "
                     "epoch reached was not restored. Call fit from the state's epoch, and keep it up to date at each "
                     "epoch's end.")
    if begins > done:
        raise Failed(f"when a worker left after {done} epochs, rank 0 went on from epoch {begins + 1}: epochs "
                     f"{done + 1} to {begins} were never trained. " + EPOCH_STATE + ".")
    return f"when a worker left after {done} epochs, rank 0 went on alone from epoch {begins + 1}"


def _returned(el: ElasticRun, chief: ElasticWorker, before: set[int]) -> str:
    """That the worker given back joined from the state the others held, and the job trained every epoch."""
    if el.returned is None:
        raise Failed(f"the job ended before the slot was given back ({el.summary}): with --elastic it must train "
                     f"all {el.epochs} epochs.")
    newcomers = [w for w in el.workers if w.pid not in before and w.fit_starts and w.fit_starts[0] > el.returned]
    if not newcomers:
        if el.stopped:
            raise Failed(f"{el.stopped}: a worker that joins runs your script from the top, alone, while the "
                         "others train, and a collective call outside the elastic function waits for them forever. "
                         "When args.elastic is set, skip the broadcast of the resume epoch: `hvd.elastic.run` "
                         "synchronises the state (weights, optimizer, epoch) from rank 0 before each call.")
        if el.ok:
            raise Failed(f"the job finished before the returning worker joined (slot given back {el.returned:.0f} s "
                         "into the run): this machine was too busy for the check to see it; check again.")
        raise Failed(f"after the slot was given back the job did not finish: {el.summary}")
    new = newcomers[0]
    if not new.epochs:
        raise Failed(f"the worker that returned called fit but never finished an epoch ({el.stopped or el.summary}): "
                     "a collective call in fit that only it makes deadlocks the job. BroadcastGlobalVariablesCallback "
                     "broadcasts at the first batch on a worker that has not yet, and the others have: skip it when "
                     "args.elastic is set (`hvd.elastic.run` gives every worker rank 0's state).")
    joined = _begins(chief, _fit_of(chief, new.fit_starts[0] + 5.0), el.epochs)  # rank 0's call of fit then
    starts = _begins(new, 0, el.epochs)
    if starts == 0 or starts != joined:
        raise Failed(f"the worker that returned began at epoch {starts + 1} while rank 0 went on from epoch "
                     f"{joined + 1}: its state did not come from rank 0. " + ELASTIC + ".")
    trained = {e for w in (chief, new) for e, _ in _job_epochs(w, el.epochs)}
    missing = sorted(set(range(1, el.epochs + 1)) - trained)
    if missing:
        shown = ", ".join(map(str, missing[:6])) + (", ..." if len(missing) > 6 else "")
        if max(trained, default=0) >= el.epochs:
            raise Failed(f"the job never trained epoch(s) {shown} of its {el.epochs}: " + EPOCH_STATE + ".")
        raise Failed(f"the worker returned, but the job did not finish its {el.epochs} epochs: {el.summary}")
    if not el.ok:
        raise Failed(f"the job trained every epoch but did not end well: {el.summary}")
    return (f"; when its slot came back a new worker joined at epoch {starts + 1}, rank 0's, and the job trained "
            f"every one of its {el.epochs} epochs")
