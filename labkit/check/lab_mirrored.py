"""The MirroredStrategy lab's four steps, judged from one probed run on 2 logical CPUs."""

from __future__ import annotations

from pathlib import Path

from labkit.check import ending, tfdist
from labkit.check.verdict import Failed
from labkit.core import contract, output
from labkit.records import evidence as saved
from labkit.records import tfdist_probe
from labkit.records.tfdist_evidence import Left, Mirrored
from labkit.records.tfdist_probe import Fit, Task

DEVICES = 2
MODEL = "saved/model.keras"
EVIDENCE = Mirrored  # what collect returns and the judges read (labkit.check.judging saves and loads it)
evidence = saved.from_json(EVIDENCE)  # the evidence from its JSON, every field checked (how a test builds one)


def collect(script: Path, upto: int, timeout: float, work: Path) -> Mirrored:
    """Run ``script`` once under the probe with ``--devices 2``."""
    probe, log = work / "probe", work / "output.log"
    cmd = tfdist.probe_command(probe, script, "--epochs", "1", "--devices", str(DEVICES),
                               "--model-path", str(work / MODEL), "--log-dir", str(work / "logs"))
    left: list[str] = []
    code, timed_out = tfdist.run_single(cmd, timeout, log, {contract.PROBE_LOAD: str(work / MODEL)}, cwd=work,
                                        left=left)
    run_error = None
    if code != 0 or timed_out:
        text = log.read_text(errors="replace") if log.exists() else ""
        why = (f"timed out after {timeout:.0f} s: "
               + ending.where_text(ending.still_running(probe, "local.0", "labkit/instrument/start.py", timeout))
               if timed_out else ending.exit_text(code))
        run_error = why + "\n" + output.error_tail(text, 12)
    unreadable: list[str] = []
    records = tfdist.records(probe, unreadable)
    return Mirrored(lab="mirrored", devices=DEVICES, batch=tfdist.BATCH, train=tfdist.TRAIN, model_path=MODEL,
                    records=records, files=tfdist.files(work), timed_out=timed_out, run_error=run_error,
                    ranks={"0": Left(left)} if left else {}, unreadable=unreadable[0] if unreadable else None)


def _record(ev: Mirrored) -> Task:
    rec = ev.records.get("local.0")
    if not rec:
        raise Failed("the script did not get to training")
    return rec


def _fit(ev: Mirrored) -> Fit:
    return tfdist.last_fit(_record(ev), "the script")


def step_1(ev: Mirrored) -> str:
    rec = ev.records.get("local.0")
    strategies = rec.strategies if rec else []
    made = [s for s in strategies if s.cls.startswith("Mirrored")]
    if not made:
        others = [s.cls for s in strategies]
        raise Failed("no tf.distribute.MirroredStrategy was created"
                     + (f" (only {', '.join(others)})" if others else "")
                     + ": split the CPU into --devices logical devices and create MirroredStrategy over them")
    n = made[-1].replicas
    if n != ev.devices:
        raise Failed(f"the MirroredStrategy has {n} replica(s) for --devices {ev.devices}: call "
                     "tf.config.set_logical_device_configuration on the CPU with --devices entries before "
                     "any tensor is created, then give MirroredStrategy those devices")
    return f"MirroredStrategy with {n} replicas in sync on {', '.join(made[-1].devices)}"


def step_2(ev: Mirrored) -> str:
    f = _fit(ev)
    n = ev.devices
    if not f.strategy.startswith("Mirrored"):
        raise Failed(f"the model belongs to {f.strategy}: build and compile it inside "
                     "`with strategy.scope():` so that its variables are mirrored")
    v = f.variables
    if not any("Mirrored" in t for t in v.types) or v.copies != n:
        raise Failed(f"the model's variables are {v.types} with {v.copies} copies; expected "
                     f"MirroredVariables with {n} copies: create the model in the strategy's scope")
    if f.after is None or f.after.replicas_equal is not True:
        raise Failed("after training the copies of the variables differ between replicas")
    return f"variables are MirroredVariables with {n} copies, identical on every replica after training"


def step_3(ev: Mirrored) -> str:
    f, n, batch = _fit(ev), ev.devices, ev.batch
    spe = tfdist.global_batch(f, batch, n, ev.train, "each replica")
    return f"the global batch of {batch * n} is split into {n} x {batch}; steps_per_epoch={spe}"


def step_4(ev: Mirrored) -> str:
    if ev.model_path not in ev.files:
        raise Failed(f"nothing was saved to --model-path ({Path(ev.model_path).name}): "
                     "call model.save(args.model_path)")
    load = _record(ev).load or tfdist_probe.Load()
    if not load.ok:
        raise Failed(f"the saved model does not load: {load.error}")
    if not load.same_weights:
        raise Failed("the saved model's weights differ from the trained ones: save after training")
    return "the saved model reloads with the trained weights"


STEPS = [step_1, step_2, step_3, step_4]
