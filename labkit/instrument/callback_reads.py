"""What a Keras callback reads from the epoch's logs, for the checks' probe (:mod:`labkit.instrument.probe`).

A callback that reads ``val_accuracy`` before MetricAverageCallback has averaged it sees
one rank's value: recording the keys each callback read, and the values it saw, shows that.
"""

from __future__ import annotations

from typing import Any

from labkit.records.hvd_probe import CallbackRead


class RecordingLogs(dict):
    """A logs dict that remembers which keys a callback read."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.read: set[str] = set()

    def __getitem__(self, k: str) -> Any:
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k: str, default: Any = None) -> Any:
        self.read.add(k)
        return super().get(k, default)

    def items(self) -> Any:
        self.read.update(self.keys())
        return super().items()

    def values(self) -> Any:
        self.read.update(self.keys())
        return super().values()

    def copy(self) -> dict:
        self.read.update(self.keys())
        return dict(super().items())


def plain(logs: dict) -> dict[str, float]:
    out = {}
    for k, v in dict.items(logs):
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def wrap_callback(cb: Any, index: int, epoch_reads: list[CallbackRead]) -> None:
    """Record what ``cb.on_epoch_end`` reads from the logs, and the values it saw."""
    original = cb.on_epoch_end
    name = f"{type(cb).__module__}.{type(cb).__qualname__}"

    def on_epoch_end(epoch: int, logs: dict | None = None) -> Any:
        if logs is None:
            return original(epoch, logs)
        proxy = RecordingLogs(logs)
        seen = plain(logs)
        try:
            return original(epoch, proxy)
        finally:
            for k in list(dict.keys(proxy)):
                logs[k] = dict.__getitem__(proxy, k)
            epoch_reads.append(CallbackRead(callback=name, index=index, epoch=epoch, read=sorted(proxy.read),
                                            seen=seen))

    cb.on_epoch_end = on_epoch_end
