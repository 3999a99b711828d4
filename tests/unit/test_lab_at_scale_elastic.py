"""Lab 9's step 5 (labkit.check.lab_at_scale.step_5) on hand-made elastic runs: every message and the run that
passes; and the pacing of the elastic run (labkit.check.elastic_run.Pace) on observations written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from labkit.check import elastic_run
from labkit.check import lab_at_scale as at
from labkit.check.verdict import Failed
from labkit.core.identity import World
from labkit.records import observation, typed
from labkit.records.observation import EpochNote, FitNote, Observation

EPOCHS = 8


def worker(pid: int, rank: int, fits: list[tuple[int, float]], epochs: list[tuple[int, float]],
           asked: list[int] | None = None) -> dict[str, Any]:
    """A process of the run: its calls of fit (initial_epoch, start; ``asked``: their epochs, default all), and the
    epochs it finished as tf.keras numbered them (1-based, end)."""
    return {"pid": pid, "rank": rank, "fits": [f for f, _ in fits], "fit_starts": [t for _, t in fits],
            "fit_epochs": asked or [EPOCHS] * len(fits), "epochs": [e for e, _ in epochs],
            "epoch_ends": [t for _, t in epochs]}


CHIEF = worker(100, 0, [(0, 10.0), (2, 31.0), (5, 44.0)],
               [(1, 20.0), (2, 29.0), (3, 32.0), (4, 33.0), (5, 34.0), (6, 46.0), (7, 47.0), (8, 48.0)])
LEAVER = worker(101, 1, [(0, 10.0)], [(1, 20.0), (2, 29.0)])
NEWCOMER = worker(102, 1, [(5, 44.0)], [(6, 46.0), (7, 47.0), (8, 48.0)])


def run(workers: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    """Lab 9's evidence whose elastic run left after 2 epochs (at 30 s) and returned after 2 more (at 35 s)."""
    from test_lab_at_scale_units import evidence

    data = evidence(covers=5)
    data["elastic"] = {"epochs": EPOCHS, "leave_after": 2, "away": 2, "ok": True, "summary": "job finished OK",
                       "left": 30.0, "returned": 35.0, "workers": workers or [CHIEF, LEAVER, NEWCOMER], **kw}
    return data


def judge(data: dict[str, Any]) -> str:
    return at.step_5(at.evidence(data))


def test_a_job_that_shrinks_restores_and_grows_passes_step_5() -> None:
    said = judge(run())
    assert "went on alone from epoch 3" in said and "joined at epoch 6, rank 0's" in said
    assert f"every one of its {EPOCHS} epochs" in said


def test_horovods_way_fit_for_the_epochs_left_from_0_passes_too() -> None:
    # fit(epochs=args.epochs - state.epoch) with UpdateEpochStateCallback: each call counts its epochs from 1
    chief = worker(100, 0, [(0, 10.0), (0, 31.0), (0, 44.0)],
                   [(1, 20.0), (2, 29.0), (1, 32.0), (2, 33.0), (3, 34.0), (1, 46.0), (2, 47.0), (3, 48.0)],
                   asked=[EPOCHS, EPOCHS - 2, EPOCHS - 5])
    newcomer = worker(102, 1, [(0, 44.0)], [(1, 46.0), (2, 47.0), (3, 48.0)], asked=[EPOCHS - 5])
    said = judge(run([chief, LEAVER, newcomer]))
    assert "went on alone from epoch 3" in said and "joined at epoch 6" in said


def test_epochs_skipped_after_a_change_of_workers_fail_step_5() -> None:
    # Horovod's UpdateEpochStateCallback with fit(initial_epoch=state.epoch): the state's epoch counted twice
    chief = worker(100, 0, [(0, 10.0), (2, 31.0), (7, 44.0)],
                   [(1, 20.0), (2, 29.0), (3, 32.0), (4, 33.0), (5, 34.0), (8, 48.0)])
    newcomer = worker(102, 1, [(7, 44.0)], [(8, 48.0)])
    with pytest.raises(Failed, match="never trained epoch.s. 6, 7 of its 8: tf.keras numbers"):
        judge(run([chief, LEAVER, newcomer]))
    skipped = worker(100, 0, [(0, 10.0), (4, 31.0)], [(1, 20.0), (2, 29.0), (5, 32.0)])
    with pytest.raises(Failed, match="epochs 3 to 4 were never trained"):
        judge(run([skipped, LEAVER, NEWCOMER]))


def test_a_newcomer_that_calls_fit_but_never_trains_is_told_of_the_broadcast_callback() -> None:
    stuck = {**NEWCOMER, "epochs": [], "epoch_ends": []}
    data = run([CHIEF, LEAVER, stuck], ok=False, stopped="the returning worker called fit but finished no epoch")
    with pytest.raises(Failed, match="BroadcastGlobalVariablesCallback"):
        judge(data)


def died(chief: dict[str, Any]) -> dict[str, Any]:
    return {**chief, "fits": chief["fits"][:1], "fit_starts": chief["fit_starts"][:1], "epochs": [1, 2],
            "epoch_ends": [20.0, 29.0]}


@pytest.mark.parametrize(("data", "message"), [
    (run(refused=True), "does not accept --elastic"),
    (run([died(CHIEF), LEAVER], ok=False, summary="rank 0 failed", returned=None), "the job stopped"),
    (run([{**CHIEF, "fits": [0], "fit_starts": [10.0]}, LEAVER], returned=None), "the job never shrank"),
    (run([{**CHIEF, "fits": [0, 0, 5]}, LEAVER, NEWCOMER]), "trained again from epoch 1: the epoch reached was not"),
    (run([CHIEF, LEAVER], stopped="the returning worker had not joined 60 s after its slot came back", ok=False),
     "runs your script from the top"),
    (run([CHIEF, LEAVER]), "too busy"),
    (run([CHIEF, LEAVER, {**NEWCOMER, "fits": [0]}]), "did not come from rank 0"),
    (run(returned=None), "ended before the slot was given back"),
    (run(left=None, returned=None), "never finished 2 epochs"),
    (run(ok=False, summary="rank 1 failed"), "did not end well"),
])
def test_an_elastic_run_that_is_not_is_told_what_to_change(data: dict[str, Any], message: str) -> None:
    with pytest.raises(Failed, match=message):
        judge(data)


def observed(folder: Path, pid: int, rank: int, fits: list[float], ends: list[float]) -> None:
    """Process ``pid``'s observation: its calls of fit and its epochs' ends (seconds)."""
    o = Observation(pid=pid, started=fits[0] - 1, world=World(rank=rank, workers=2),
                    fits=[FitNote(start=t, initial_epoch=0) for t in fits],
                    epochs=[EpochNote(epoch=e, end=t) for e, t in enumerate(ends, 1)])
    observation.path(folder, pid).write_text(json.dumps(typed.dump(o)))


def test_the_run_takes_a_slot_away_gives_it_back_and_stops_a_worker_that_never_joins(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    hosts_now, now = tmp_path / "hosts.now", [1000.0]
    monkeypatch.setattr(elastic_run.time, "time", lambda: now[0])
    pace = elastic_run.Pace(hosts_now, 1000.0)
    observed(tmp_path, 7, 0, [1001.0], [1002.0])
    assert pace(tmp_path) is None and not hosts_now.exists()
    observed(tmp_path, 7, 0, [1001.0], [1002.0, 1003.0])  # LEAVE_AFTER epochs
    now[0] = 1010.0
    assert pace(tmp_path) is None and hosts_now.read_text() == "localhost:1\n" and pace.left == 10.0
    observed(tmp_path, 7, 0, [1001.0], [1002.0, 1003.0, 1011.0, 1012.0])  # epochs, but still on 2 workers
    now[0] = 1013.0
    assert pace(tmp_path) is None and hosts_now.read_text() == "localhost:1\n"
    observed(tmp_path, 7, 0, [1001.0, 1013.0], [1002.0, 1003.0, 1011.0, 1012.0, 1014.0])  # alone, 1 epoch
    now[0] = 1015.0
    assert pace(tmp_path) is None and hosts_now.read_text() == "localhost:1\n"
    observed(tmp_path, 7, 0, [1001.0, 1013.0], [1002.0, 1003.0, 1011.0, 1012.0, 1014.0, 1015.0])  # AWAY epochs
    now[0] = 1020.0
    assert pace(tmp_path) is None and hosts_now.read_text() == "localhost:2\n" and pace.returned == 20.0
    now[0] = 1020.0 + elastic_run.JOIN_S + 1
    assert "had not joined" in (pace(tmp_path) or "")
    observed(tmp_path, 8, 1, [1025.0], [])  # joined, in fit, but no epoch finished (a collective only it makes)
    now[0] = 1025.0 + elastic_run.JOIN_S - 1
    assert pace(tmp_path) is None
    now[0] = 1025.0 + elastic_run.JOIN_S + 1
    assert "finished no epoch" in (pace(tmp_path) or "")
    observed(tmp_path, 8, 1, [1025.0], [1030.0])  # a worker that joined after the slot came back, and trains
    assert pace(tmp_path) is None


def test_on_other_hosts_the_second_leaves_and_each_runs_one_worker(tmp_path: Path) -> None:
    given = tmp_path / "nodes"
    given.write_text("# nodes\n198.18.0.11 slots=2  # node1\n198.18.0.12 slots=2\n198.18.0.13 slots=2\n")
    one_slot, (whole, fewer) = elastic_run.on_hosts(given, tmp_path)
    assert one_slot.read_text() == "198.18.0.11 slots=1\n198.18.0.12 slots=1\n"
    assert (whole, fewer) == ("198.18.0.11:1\n198.18.0.12:1\n", "198.18.0.11:1\n")
    given.write_text("198.18.0.11 slots=2\n")
    with pytest.raises(ValueError, match="needs 2 hosts"):
        elastic_run.on_hosts(given, tmp_path)


def test_the_nodes_cell_says_why_it_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from labkit.nodes.virtual import VirtualNodes
    from labkit.ui import nodes_lab, notebook, scale_lab

    started: list[object] = []
    monkeypatch.setattr(elastic_run, "run", lambda *a, **k: started.append(a))
    script = tmp_path / "fashion_mnist.py"
    script.write_text("print('mine')\n")
    monkeypatch.setattr(notebook, "untouched", lambda s: True)
    assert scale_lab.elastic_on_nodes(str(script)) is None and "still the starter" in capsys.readouterr().out
    monkeypatch.setattr(notebook, "untouched", lambda s: False)
    monkeypatch.setattr(nodes_lab, "why_not", lambda: "virtual nodes need root.")
    assert scale_lab.elastic_on_nodes(str(script)) is None
    assert "Not run: virtual nodes need root. Step 5's check ran" in capsys.readouterr().out
    monkeypatch.setattr(nodes_lab, "why_not", lambda: None)
    monkeypatch.setattr(VirtualNodes, "load", classmethod(lambda cls, folder=None: None))
    assert scale_lab.elastic_on_nodes(str(script)) is None
    assert "No virtual nodes are up: start two as root (`labkit nodes up`" in capsys.readouterr().out
    assert started == []
