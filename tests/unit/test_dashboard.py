"""labkit.ui.dashboard: follows a fake progress file, as widgets and as text; watch() links the run record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from labkit.core import files
from labkit.records import runs, typed
from labkit.records.runrecord import EpochStats, RunRecord
from labkit.ui import dashboard


def state(epochs: int, status: str = "running") -> RunRecord:
    return RunRecord(run_id="r1", status=status, workers=2, epochs_requested=3,
                     epochs=[EpochStats(epoch=i + 1, train_s=2.0, wall_s=2.5, images_per_sec=100.0 + i,
                                        metrics={"val_accuracy": 0.5 + i / 10}) for i in range(epochs)])


def live(path: Path, record: RunRecord) -> None:
    """The progress file as the observed chief writes it (a record, stamped ``updated``)."""
    runs.write_live(record, path)


def test_read_state_tolerates_missing_and_damaged_files(tmp_path: Path) -> None:
    assert dashboard.read_state(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert dashboard.read_state(tmp_path / "bad.json") is None
    files.write_json_atomic(tmp_path / "other.json", {"run_id": "r1", "epochs": [{"epoch": "one"}]})
    assert dashboard.read_state(tmp_path / "other.json") is None  # no run record: nothing to show
    files.write_json_atomic(tmp_path / "ok.json", typed.dump(state(1)))
    assert dashboard.read_state(tmp_path / "ok.json") == state(1)


def test_summary_and_lines() -> None:
    assert "waiting" in dashboard.summary(None)
    s = dashboard.summary(state(2))
    assert "epoch 2/3" in s and "101.0 images/sec" in s and "0.600" in s and "2 worker" in s
    line = dashboard.epoch_line(state(1).epochs[0])
    assert line == "epoch 1: 2.0 s training, 100.0 images/sec, val accuracy 0.500"


def test_widgets_follow_the_progress_file(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    path = tmp_path / "runs.jsonl"
    board = dashboard.Dashboard("r1", path, text=False)
    assert board.refresh() is None and board.bar.value == 0  # no file yet
    live(path, state(1))
    board.refresh()
    assert (board.bar.value, board.bar.max, board.bar.bar_style) == (1, 3, "info")
    assert "epoch 1/3" in board.status.value and "100.0" in board.table.value
    live(path, state(3, "ok"))
    board.refresh()
    assert (board.bar.value, board.bar.bar_style) == (3, "success")
    assert board.table.value.count("<tr>") == 4  # header + 3 epochs
    live(path, state(1, "failed"))
    board.refresh()
    assert board.bar.bar_style == "danger"


def test_text_mode_prints_each_epoch_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "runs.jsonl"
    board = dashboard.Dashboard("r1", path, text=True)
    live(path, state(1))
    board.refresh()
    live(path, state(2))
    board.refresh()
    board.refresh()
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["epoch 1", "epoch 2"]


def test_watch_runs_the_job_and_shows_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    from labkit.launching import launch

    seen = {}

    def fake_run(command, np, job, **kw):
        env, sink = job.env, job.sink
        seen.update(env=env, np=np)
        for k in (1, 2, 3):  # a job that trains three epochs; rank 0 says so in its output
            sink.line(f"Epoch {k}/3")
            runs.write_live(dataclasses.replace(state(k, "ok" if k == 3 else "running"), run_id=env[runs.RUN_ID_VAR]),
                            env[runs.FILE_VAR])
            sink.progress("1/47 [>.....] - ETA: 4s - loss: 2.3")
        sink.line("47/47 [==============================] - 5s 98ms/step - loss: 0.4")
        runs.append(RunRecord(run_id=env[runs.RUN_ID_VAR], status="ok", images_per_sec=101.5), env[runs.FILE_VAR])
        return launch.JobResult(0, list(command), tmp_path, np, 0.5)

    monkeypatch.setattr(launch, "run", fake_run)
    result = dashboard.watch(["python", "train.py"], np=2, text=True,
                             env={runs.FILE_VAR: str(tmp_path / "runs.jsonl")})
    assert seen["np"] == 2 and Path(seen["env"][runs.FILE_VAR]).is_absolute()
    assert result.record.images_per_sec == 101.5
    out = capsys.readouterr().out
    assert out.count("epoch 1:") == 1 and "epoch 3:" in out and "ok: epoch 3/3" in out
    assert "Epoch 1/3" not in out and "ETA" not in out  # the dashboard, not rank 0's output


def test_watch_prints_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture) -> None:
    from labkit.launching import launch

    def fake_run(command, np, job, **kw):
        sink = job.sink
        sink.line("Traceback (most recent call last):")
        return launch.JobResult(1, list(command), tmp_path, np, 0.5, rank_errors={0: "ValueError: bad shape"})

    monkeypatch.setattr(launch, "run", fake_run)
    result = dashboard.watch(["python", "train.py"], np=2, text=True, records=tmp_path / "runs.jsonl")
    out = capsys.readouterr().out
    assert not result.ok and result.record is None and "ValueError: bad shape" in out


def test_a_flood_of_output_looks_at_the_record_at_most_twice_a_second(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    board = dashboard.Dashboard("r1", tmp_path / "runs.jsonl", text=True)
    looks = []
    monkeypatch.setattr(board, "refresh", lambda: looks.append(1))
    for k in range(2000):  # Keras' redraws and a script's prints, as fast as they come
        board.progress(f"{k}/2000 [>....] - ETA: 1s")
        board.line(f"print {k}")
    assert 1 <= len(looks) <= 2
    n = len(looks)
    board.line("Epoch 2/3")  # an epoch begins: the one before is in the record, look now
    board.line("Epoch 3/3")
    assert len(looks) == n + 2
