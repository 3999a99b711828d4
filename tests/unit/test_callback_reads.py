"""labkit.instrument.callback_reads: what a callback read from the logs, and what it saw."""

from __future__ import annotations

from labkit.instrument import callback_reads
from labkit.records.hvd_probe import CallbackRead


def test_recording_logs_notes_reads_not_writes() -> None:
    logs = callback_reads.RecordingLogs({"val_accuracy": 0.5, "loss": 1.0})
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
    callback_reads.wrap_callback(cb, 3, reads)
    logs = {"val_loss": 2.0, "loss": 1.0}
    cb.on_epoch_end(0, logs)
    assert cb.seen == 2.0 and logs["val_loss"] == 0.0
    assert reads == [CallbackRead(callback=f"{Reader.__module__}.{Reader.__qualname__}", index=3, epoch=0,
                                  read=["val_loss"], seen={"val_loss": 2.0, "loss": 1.0})]
