"""labkit.check.lab_communication: lab 8's exercise judged on hand-made evidence (what the probe's 2 ranks
all-reduced with --fp16-allreduce), without TensorFlow."""

from __future__ import annotations

from typing import Any

import pytest

from labkit.check import judging, lab_communication
from labkit.check.lab_horovod import ARGS as HOROVOD_ARGS
from labkit.course import labs

TRAINED = ["start", "patched", "hvd_init", "fit_start", "batch0_end", "batch1_end", "epoch0_end", "train_end", "end"]
REFUSED = ("usage: fashion_mnist.py [-h] [--log-dir LOG_DIR] ...\n"
           "fashion_mnist.py: error: unrecognized arguments: --fp16-allreduce\n")


def _evidence(gradients: dict[str, int] | None, milestones: list[str] = TRAINED, initialized: bool = True,
              log_tail: str = "", other: dict[str, int] | None = None) -> dict[str, Any]:
    """A 2-rank run of the check, every rank alike: its milestones, its Horovod, what it all-reduced."""
    states = {str(r): {"milestones": list(milestones), "error": None, "exit_code": 0 if "end" in milestones else None,
                       "hvd": {"initialized": initialized, "rank": r, "size": 2, "local_rank": 1 - r}}
              for r in range(2)}
    ranks = {str(r): {"exit": 0, "error": "", "log_tail": log_tail, "stalled": False} for r in range(2)}
    record = {"gradients": gradients or {}, "other": other if other is not None else {"float32": 4}}
    return {"lab": "communication", "np": 2, "batch": 16, "states": states, "weights": {}, "ranks": ranks,
            "timed_out": False, "interrupted": False, "returncode": 0, "start_error": None,
            "allreduce": {} if gradients is None else {"0": record, "1": record}}


def _fails(ev: dict[str, Any]) -> str:
    with pytest.raises(judging.Failed) as failed:
        lab_communication.step_1(lab_communication.evidence(ev))
    return str(failed.value)


def test_one_run_with_the_flag_as_the_horovod_check_runs_the_script() -> None:
    assert lab_communication.ARGS == [*HOROVOD_ARGS, "--fp16-allreduce"]
    assert lab_communication.upto(1) == 1 and len(lab_communication.STEPS) == labs.get("communication").n_steps


def test_float16_gradients_pass_whatever_else_was_all_reduced() -> None:
    ev = _evidence({"float16": 26}, other={"float32": 4})  # the metrics stay float32
    said = lab_communication.step_1(lab_communication.evidence(ev))
    assert "each rank all-reduced its 26 gradient tensors as float16" in said
    assert "without it they should stay float32" in said


def test_float32_gradients_with_the_flag_say_what_to_pass() -> None:
    said = _fails(_evidence({"float32": 26}))
    assert said.startswith("with --fp16-allreduce the gradients were still all-reduced as float32: pass "
                           "`compression=hvd.Compression.fp16` to hvd.DistributedOptimizer when args.fp16_allreduce "
                           "is set (rank 0 sent all 26 as float32)")


def test_some_gradients_left_as_float32_are_counted() -> None:
    said = _fails(_evidence({"float16": 20, "float32": 6}))
    assert "rank 0 all-reduced 20 as float16 and 6 as float32 of its 26 gradient tensors" in said
    assert "every gradient should cross as float16" in said


def test_another_half_precision_is_not_the_option() -> None:
    assert "asks for float16" in _fails(_evidence({"bfloat16": 26}))


def test_a_script_without_the_option_is_told_to_add_it() -> None:
    ev = _evidence(None, ["start", "patched", "hvd_init", "end"], log_tail=REFUSED)
    for info in ev["ranks"].values():
        info["exit"] = 2
    said = _fails(ev)
    assert "does not accept --fp16-allreduce" in said and "add the --fp16-allreduce option to parse_args" in said
    assert "not initialised" not in said
    for state in ev["states"].values():  # the starter: Horovod is lab 2's step 1
        state["hvd"] = {"initialized": False}
    assert "if this is not yet your Horovod script of lab 2, finish that lab first" in _fails(ev)
    results = judging.judge(lab_communication, lab_communication.evidence(ev), 1, labs.get("communication").steps)
    title = "the --fp16-allreduce option sends the gradients as float16"
    assert not results[0].passed and results[0].message.startswith(f"{title}: the script does not accept")


def test_a_script_that_all_reduces_no_gradient_is_sent_back_to_lab_2() -> None:
    assert "not Horovod's" in _fails(_evidence({}, other={}))
    assert "Finish its eight steps" in _fails(_evidence({}, initialized=False))


def test_a_run_that_never_trained_says_why() -> None:
    ev = _evidence(None, ["start", "patched", "hvd_init"])
    ev["states"]["1"]["error"] = {"type": "ValueError", "message": "bad compressor", "traceback": ""}
    said = _fails(ev)
    assert "rank 1 crashed before the second training batch: ValueError: bad compressor" in said


def test_a_horovod_the_probe_cannot_observe_is_said() -> None:
    ev = _evidence({"float16": 26})
    ev["allreduce"]["1"] = {"error": "horovod.tensorflow has no _allreduce: this Horovod cannot be observed"}
    assert "could not see what Horovod all-reduced" in _fails(ev)
