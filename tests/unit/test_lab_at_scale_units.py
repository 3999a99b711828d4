"""Lab 9's judges (labkit.check.lab_at_scale) on hand-made evidence: every message, and the correct ways that pass."""

from __future__ import annotations

from typing import Any

import pytest

from labkit.check import lab_at_scale as at
from labkit.check.verdict import Failed

RATES = [[0.06, 0.072, 0.084, 0.096, 0.108, 0.12], [0.12] * 6]  # warmed up over the first epoch to 0.02 x 2 x 3
NORM = 3.0  # the norm of what an all-reduce returned


def _epochs(rank: int, reduce_every: int = at.K, move_every: int = at.K, step: float = 1 / at.K,
            rates: list[list[float]] = RATES) -> list[dict[str, Any]]:
    """Two epochs of 6 batches: all-reduces at every ``reduce_every``-th batch, moves at every ``move_every``-th,
    an update of ``step`` x rate x the all-reduced norm (1/K: the K batches' gradients averaged)."""
    out, i = [], 0
    for e, lrs in enumerate(rates):
        moved, reduced, norms = [], [], []
        for lr in lrs:
            i += 1
            reduced.append(30 if i % reduce_every == 0 else 0)
            norms.append(NORM if i % reduce_every == 0 else 0.0)
            moves = i % move_every == 0 or (rank and i == 1)  # another rank's first batch: rank 0's broadcast
            moved.append(step * (lr or 0.1) * NORM if moves else 0.0)
        out.append({"epoch": e, "train_batches": len(lrs), "lr": lrs, "moved": moved, "reduced": reduced,
                    "reduced_norm": norms})
    return out


def _layers(compute: str = "bfloat16", variables: str = "float32") -> list[dict[str, Any]]:
    body = [{"name": f"conv2d_{k}", "kind": "Conv2D", "compute": compute, "variables": [variables]} for k in range(16)]
    return [*body, {"name": "dense", "kind": "Dense", "compute": "float32", "variables": [variables]},
            {"name": "add", "kind": "Add", "compute": compute, "variables": []}]


def evidence(epochs: Any = _epochs, stats: dict[str, list[float]] | None = None, layers: Any = None,
             outputs: tuple[str, ...] | None = ("float32",), non_trainable: int = 64,
             errors: dict[int, str] | None = None, covers: int = 3) -> dict[str, Any]:
    """A 2-rank run of lab 9's check that trained to the end (``errors``: ranks that crashed instead)."""
    base = {"init": [0.0] * 8, "b1": [1.0] * 8, "final": [2.0] * 8}
    stats = stats or {}
    states, weights, ranks = {}, {}, {}
    for r in range(2):
        crashed = (errors or {}).get(r)
        milestones = ["start", "hvd_init", "fit_start", "train_begin"] + ([] if crashed else ["train_end", "end"])
        states[str(r)] = {
            "milestones": milestones, "hvd": {"initialized": True, "rank": r, "size": 2},
            "epochs": [] if crashed else epochs(r),
            "model": {"layers": layers if layers is not None else _layers(),
                      "outputs": list(outputs) if outputs is not None else None, "non_trainable": non_trainable},
            "error": {"type": "TypeError", "message": crashed, "traceback": ""} if crashed else None}
        weights[str(r)] = {f"stats_{m}": stats.get(f"{r}.{m}", v) for m, v in base.items()}
        ranks[str(r)] = {"exit": 1 if crashed else 0}
    return {"np": 2, "batch": 16, "lab": "at-scale", "args": at.run_args(covers), "states": states,
            "weights": weights, "ranks": ranks, "returncode": 1 if errors else 0}


def judge(step: int, data: dict[str, Any]) -> str:
    return at.STEPS[step - 1](at.evidence(data))


def test_the_finished_script_passes_every_step() -> None:
    data = evidence()
    assert "once every 3 batches (averaged over them)" in judge(1, data)
    assert "0.12" in judge(1, data) and "once every 3 batches" in judge(1, data)
    assert "the same after the second batch" in judge(2, data)
    assert "16 of the model's 17 layers with variables computed in bfloat16" in judge(3, data)


def test_summed_gradients_at_the_workers_rate_are_the_same_update_and_pass() -> None:
    half = [[r / at.K for r in ep] for ep in RATES]
    data = evidence(lambda r: _epochs(r, step=1.0, rates=half))
    assert "summed over them" in judge(1, data)


@pytest.mark.parametrize(("epochs", "message"), [
    (lambda r: _epochs(r, reduce_every=1, move_every=1), "still all-reduced its gradients at every batch"),
    (lambda r: _epochs(r, move_every=1), "weights changed at every batch"),
    (lambda r: _epochs(r, reduce_every=2, move_every=2), "once every 3 batches (3, 6, 9"),
    (lambda r: _epochs(r, reduce_every=10**6), "all-reduced no gradients"),
    (lambda r: _epochs(r, step=0.15), "times the learning rate times the average gradient"),
    (lambda r: _epochs(r, step=1.0), "summed over the 3 batches, not averaged"),
    (lambda r: _epochs(r, rates=[[x / 2 for x in ep] for ep in RATES]), "rose to 0.06 at most"),
    (lambda r: _epochs(r, rates=[[None] * 6, [None] * 6]), "could not be read"),
    (lambda r: [{**e, "lr": e["lr"][:2], "moved": e["moved"][:2], "reduced": e["reduced"][:2],
                 "reduced_norm": e["reduced_norm"][:2]} for e in _epochs(r)][:1], "too few"),
])
def test_accumulation_that_is_not_is_told_what_to_change(epochs: Any, message: str) -> None:
    with pytest.raises(Failed, match=message.replace("(", r"\(").replace(".", r"\.").replace("×", ".")):
        judge(1, evidence(epochs))


def test_rank_1s_first_batch_moved_by_the_broadcast_is_not_named_as_an_update() -> None:
    with pytest.raises(Failed, match=r"rank 0's weights changed at every batch") as e:
        judge(1, evidence(lambda r: _epochs(r, move_every=1)))
    assert "rank 1" not in str(e.value)


def test_a_script_without_the_option_is_told_to_add_it() -> None:
    data = evidence()
    data["ranks"]["0"] = {"exit": 2, "error": "error: unrecognized arguments: --accumulate 2"}
    with pytest.raises(Failed, match="does not accept --accumulate") as e:
        judge(1, data)
    assert "finish lab 2 first" not in str(e.value)
    data["states"] = {}  # the baseline script: argparse refused before Horovod was ever initialised
    with pytest.raises(Failed, match="does not accept --accumulate.*finish lab 2 first"):
        judge(1, data)
    data = evidence()
    data["states"]["0"]["ignored_args"] = ["--sync-bn", "--precision"]
    with pytest.raises(Failed, match="does not accept --sync-bn"):
        judge(2, data)
    with pytest.raises(Failed, match="does not accept --precision"):
        judge(3, data)


def test_a_crash_says_which_options_the_run_had_and_what_bfloat16_needs() -> None:
    with pytest.raises(Failed, match="--sync-bn, --precision as well.*--step 1"):
        judge(1, evidence(errors={0: "boom"}))
    with pytest.raises(Failed, match="mixed_bfloat16"):
        judge(1, evidence(errors={0: "Value passed to parameter 'tensor' has DataType bfloat16 not in list of "
                                     "allowed values: float16, float32"}))
    with pytest.raises(Failed, match="crashed") as e:
        judge(1, evidence(errors={0: "boom"}, covers=1))
    assert "--step 1" not in str(e.value)


@pytest.mark.parametrize(("kw", "message"), [
    ({"stats": {"1.b1": [1.1] * 8}}, "differ from rank 0's after the second batch"),
    ({"stats": {"1.final": [2.5] * 8}}, "differ from rank 0's at the end of training"),  # a broadcast at the end
    ({"stats": {"0.final": [0.0] * 8}}, "never changed"),
    ({"non_trainable": 0}, "no moving statistics"),
])
def test_statistics_that_are_not_the_global_batchs_fail_step_2(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(Failed, match=message):
        judge(2, evidence(**kw))


@pytest.mark.parametrize(("kw", "message"), [
    ({"layers": _layers(compute="float32")}, "every layer of rank 0's model computed in float32"),
    ({"layers": _layers(compute="float16")}, "computed in float16"),
    ({"layers": _layers(variables="bfloat16")}, "not \"bfloat16\""),
    ({"outputs": ("bfloat16",)}, "dtype=\"float32\""),
    ({"outputs": None, "layers": _layers()[:-2] + [_layers()[-1]]}, "returns bfloat16"),  # subclassed, last bf16
    ({"layers": [{"name": f"c{k}", "compute": "float32", "variables": ["float32"]} for k in range(9)]
      + [{"name": "d", "compute": "bfloat16", "variables": ["float32"]}]}, "most of rank 0's layers"),
])
def test_precision_that_is_not_mixed_bfloat16_fails_step_3(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(Failed, match=message):
        judge(3, evidence(**kw))


def test_correct_models_written_otherwise_pass_step_3() -> None:
    counter = {"name": "normalization", "kind": "Normalization", "compute": "bfloat16",
               "variables": ["float32", "int64"]}  # a count kept as an integer is no precision
    assert "computed in bfloat16" in judge(3, evidence(layers=[*_layers(), counter]))
    assert "computed in bfloat16" in judge(3, evidence(outputs=None))  # subclassed: its last layer is float32


def test_each_step_runs_with_the_options_of_the_steps_before_it() -> None:
    assert at.upto(1) == 1 and at.upto(3) == 3 and at.upto(4) == 4 and at.upto(5) == 5 and at.upto(9) == 5
    assert "--accumulate" in at.run_args(1) and "--sync-bn" not in at.run_args(1)
    assert at.run_args(3)[-5:] == ["--accumulate", "3", "--sync-bn", "--precision", "bf16"]
    assert at.run_args(4)[-2:] == ["--profile-dir", at.PROFILE_DIR]


def profiled(**by_rank: dict[str, Any]) -> dict[str, Any]:
    """The evidence of a run with --profile-dir: what each rank (``r0``, ``r1``) left in its folder."""
    data = evidence(covers=4)
    data["profiles"] = {k[1:]: v for k, v in by_rank.items()}
    return data


def test_a_profile_of_training_steps_on_rank_0_alone_passes_step_4() -> None:
    said = judge(4, profiled(r0={"files": 1, "steps": 3, "collectives": 60}, r1={}))
    assert "rank 0 profiled 3 training step(s)" in said and "60 Horovod" in said
    assert "rank 0 profiled" in judge(4, profiled(r0={"files": 2, "steps": 40, "collectives": 0}))


@pytest.mark.parametrize(("by_rank", "message"), [
    ({"r0": {}, "r1": {}}, "rank 0 wrote no profile"),
    ({}, "rank 0 wrote no profile"),
    ({"r0": {"files": 1, "steps": 0}}, "holds no training step"),
    ({"r0": {"files": 1, "error": "profile/x.xplane.pb: not a TensorFlow profile (DecodeError)"}},
     "not a TensorFlow profile"),
    ({"r0": {"files": 1, "steps": 3}, "r1": {"files": 1, "steps": 3}}, "rank 1 wrote a profile too"),
    ({"r0": {}, "r1": {"files": 1, "steps": 3}}, "rank 0 wrote no profile"),  # rank 1 instead of rank 0
])
def test_a_profile_missing_empty_or_on_every_rank_fails_step_4(by_rank: dict[str, Any], message: str) -> None:
    with pytest.raises(Failed, match=message):
        judge(4, profiled(**by_rank))


def test_a_script_without_profile_dir_is_told_to_add_it() -> None:
    data = profiled()
    for r in ("0", "1"):
        data["states"][r]["ignored_args"] = ["--profile-dir"]
    with pytest.raises(Failed, match="does not accept --profile-dir"):
        judge(4, data)
