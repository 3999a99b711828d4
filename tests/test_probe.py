"""labkit.probe pieces that need no MPI: metric-read recording, conv shrinking, data slices."""

from __future__ import annotations

from labkit import probe


def test_recording_logs_notes_reads_not_writes() -> None:
    logs = probe.RecordingLogs({"val_accuracy": 0.5, "loss": 1.0})
    logs["lr"] = 0.1
    assert logs.get("val_accuracy") == 0.5
    assert logs.read == {"val_accuracy"}
    dict(logs.items())
    assert logs.read == {"val_accuracy", "loss", "lr"}


def test_wrap_callback_records_what_a_callback_saw_and_keeps_its_writes() -> None:
    class Reader:
        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self.seen = logs["val_loss"]
            logs["val_loss"] = 0.0  # e.g. MetricAverageCallback rewrites values in place

    reads: list = []
    cb = Reader()
    probe.wrap_callback(cb, 3, reads)
    logs = {"val_loss": 2.0, "loss": 1.0}
    cb.on_epoch_end(0, logs)
    assert cb.seen == 2.0 and logs["val_loss"] == 0.0
    assert reads == [{"epoch": 0, "index": 3, "callback": f"{Reader.__module__}.{Reader.__qualname__}",
                      "read": ["val_loss"], "seen": {"val_loss": 2.0, "loss": 1.0}}]


def test_shrink_is_consistent_and_narrow() -> None:
    assert probe.shrink(16) == 16
    assert probe.shrink(160) == 20 and probe.shrink(640) == 80
    assert probe.shrink(32) == 8  # never below 8 channels
