"""A launch's progress in a notebook: Keras' epoch and step lines drive two widget bars."""

from __future__ import annotations

import pytest

from labkit.core import contract, output, progress


def test_keras_progress_moves_the_bars_and_finished_lines_stay_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    sink = progress.WidgetSink()
    shown: list[object] = []
    sink._display = lambda obj, **kw: shown.append(obj)  # what the cell would display
    r = output.Renderer(sink.line, sink.progress)
    first = b" 1/8 [==>.......] - ETA: 3s - loss: 2.3"
    r.feed(b"Epoch 1/3\n" + first + b"\b" * len(first))  # Keras erases the line before redrawing it
    assert sink.epochs.max == 3 and sink.epochs.value == 0 and sink.steps.value == 1 and sink.steps.max == 8
    assert "loss: 2.3" in sink.label.value
    r.feed(b" 5/8 [=====>....] - ETA: 1s - loss: 1.9")
    assert sink.steps.value == 5 and "loss: 1.9" in sink.label.value
    r.feed(b"\r8/8 [==========] - 4s 500ms/step - loss: 1.7 - accuracy: 0.41\nEpoch 2/3\n")
    assert sink.steps.value == 0 and sink.epochs.value == 1 and sink.epochs.description == "epoch 2/3"
    assert len(shown) == 1  # one box of bars, updated in place
    out = capsys.readouterr().out
    assert "Epoch 1/3" in out and "8/8 [==========] - 4s" in out and "Epoch 2/3" in out


def test_text_where_widgets_cannot_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    assert isinstance(progress.default_sink(), progress.WidgetSink)
    monkeypatch.setenv(contract.DASHBOARD, "text")
    sink = progress.default_sink()
    assert isinstance(sink, output.NotebookSink) and not isinstance(sink, progress.WidgetSink)
    monkeypatch.setattr(progress, "in_notebook", lambda: False)
    assert isinstance(progress.default_sink(), output.ConsoleSink)
