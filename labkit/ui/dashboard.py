"""A live dashboard for a job started from a notebook: epochs done, images/sec, accuracy.

    from labkit.ui import dashboard
    result = dashboard.watch(["python", "fashion_mnist.py", "--epochs", "5"], np=2)

:func:`watch` starts the job with :func:`labkit.launching.launch.run` and gives it a
:class:`Dashboard` as its sink: the launch's one progress channel (the shown rank's
output, :mod:`labkit.core.progress`) tells the dashboard when to look, and each time it
re-reads the run's live record (``runs/live/RUN_ID.json``, which the observed chief
replaces atomically after every epoch; read bounded as a :class:`labkit.records.runrecord.RunRecord`,
:func:`labkit.records.runs.read_live`) for the figures it shows. Where widgets cannot
render (a terminal, a notebook executed headless) the same is printed as text, one line
per epoch.
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path
from typing import Any

from labkit.core import progress
from labkit.launching import jobspec, launch
from labkit.records import runs
from labkit.records.runrecord import EpochStats, RunRecord


def read_state(path: str | os.PathLike) -> RunRecord | None:
    """The progress file's record, or None if it does not exist (yet) or is no run record."""
    return runs.read_live(path)


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _count(value: Any) -> int | None:
    """The epochs the script asked for as a number (it may have given them as text), else None."""
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except ValueError:
        return None


def summary(state: RunRecord | None) -> str:
    """One line: status, epochs done, last images/sec and validation accuracy."""
    if not state:
        return "waiting for the first epoch..."
    epochs = state.epochs
    total = state.epochs_requested or "?"
    last = epochs[-1] if epochs else EpochStats()
    return (f"{state.status or '?'}: epoch {len(epochs)}/{total} on {state.workers or '?'} worker(s), "
            f"{_f(last.images_per_sec, '.1f')} images/sec, "
            f"val accuracy {_f(last.val_accuracy, '.3f')}")


def epoch_line(e: EpochStats) -> str:
    return (f"epoch {e.epoch}: {_f(e.train_s, '.1f')} s training, "
            f"{_f(e.images_per_sec, '.1f')} images/sec, val accuracy {_f(e.val_accuracy, '.3f')}")


def table_html(state: RunRecord | None) -> str:
    rows = "".join(
        f"<tr><td>{e.epoch}</td><td>{_f(e.train_s, '.1f')}</td><td>{_f(e.wall_s, '.1f')}</td>"
        f"<td>{_f(e.images_per_sec, '.1f')}</td><td>{_f(e.val_accuracy, '.3f')}</td></tr>"
        for e in (state.epochs if state else [])
    )
    head = ("<tr><th>epoch</th><th>training s</th><th>epoch s</th><th>images/sec</th>"
            "<th>val accuracy</th></tr>")
    return f"<table>{head}{rows}</table>"


class Dashboard:
    """Widgets that show one run's progress file; :meth:`refresh` re-reads it."""

    def __init__(self, run_id: str, runs_file: str | os.PathLike | None = None, title: str | None = None,
                 text: bool | None = None) -> None:
        self.run_id = run_id
        self.path = runs.live_file(run_id, runs_file)
        self.title = title or f"run {run_id}"
        self.state: RunRecord | None = None
        self.printed = 0  # epochs already printed in text mode
        self.looked = 0.0
        self.text = (not progress.widgets_work()) if text is None else text
        self.widget = None if self.text else self._build()

    def _build(self) -> Any:
        import ipywidgets as w

        self.header = w.HTML(f"<b>{html.escape(self.title)}</b>")
        self.bar = w.IntProgress(value=0, min=0, max=1, description="epochs", bar_style="info")
        self.status = w.Label(summary(None))
        self.table = w.HTML(table_html(None))
        return w.VBox([self.header, self.bar, self.status, self.table])

    def display(self) -> Dashboard:
        if self.widget is not None:
            from IPython.display import display

            display(self.widget)
        else:
            print(f"{self.title}: progress in {self.path}", flush=True)
        return self

    def refresh(self) -> RunRecord | None:
        """Re-read the progress file and update the display; return the state."""
        state = read_state(self.path)
        if state is None:
            return self.state
        self.state = state
        epochs = state.epochs
        if self.widget is not None:
            total = _count(state.epochs_requested) or max(1, len(epochs))
            self.bar.max = max(total, len(epochs), 1)
            self.bar.value = len(epochs)
            status = state.status
            self.bar.bar_style = "success" if status == "ok" else "danger" if status in (
                "failed", "interrupted", "timeout") else "info"
            self.status.value = summary(state)
            self.table.value = table_html(state)
        else:
            for e in epochs[self.printed:]:
                print(epoch_line(e), flush=True)
            self.printed = len(epochs)
        return state

    # The launch's sink: rank 0's output says when to look again; the output itself is not shown, the dashboard
    # is. An epoch's first line (the one before has just been recorded) is always a moment to look; other lines
    # and Keras' progress redraws, many a second, look at most twice a second.
    def line(self, text: str) -> None:
        self._look(force=bool(progress.EPOCH.match(text)))

    def progress(self, text: str) -> None:
        self._look()

    def _look(self, force: bool = False) -> None:
        if force or time.monotonic() - self.looked >= 0.5:
            self.looked = time.monotonic()
            self.refresh()


def watch(command: list[str] | str, np: int = 2, title: str | None = None, text: bool | None = None,
          records: str | Path | None = None, **run_kw: Any) -> Any:
    """Run ``command`` on ``np`` workers (:func:`labkit.launching.launch.run`) with a live dashboard.

    The dashboard takes the place of rank 0's streamed output (every rank's log is still
    written). The run record goes to ``records`` (default: ``$LABKIT_RUNS_FILE`` or
    ``runs/runs.jsonl``). Returns the :class:`JobResult` with the run record as
    ``result.record`` (None if the script wrote none); a failed job's summary is printed.
    """
    env = dict(run_kw.pop("env", None) or {})
    run_id = env.setdefault(runs.RUN_ID_VAR, runs.new_run_id())
    records = Path(records or env.get(runs.FILE_VAR) or runs.runs_file())
    if not records.is_absolute():
        records = (Path(run_kw.get("cwd") or ".") / records).resolve()
    env[runs.FILE_VAR] = str(records)
    shown = " ".join(command) if isinstance(command, list) else command
    board = Dashboard(run_id, records, title or f"{shown} on {np} worker(s)", text=text).display()
    started = time.perf_counter()
    spec, where = jobspec.split(run_kw)  # a cell's flat options: the job's, and launcher, hosts, ...
    result = launch.run(command, np, job=spec.but(env=env, sink=board), **where)
    board.refresh()
    found = runs.select(runs.read(records, warn=False), run_id=run_id)
    result.record = found[-1] if found else None
    if board.text:
        print(f"{summary(board.state)} ({time.perf_counter() - started:.0f} s)", flush=True)
    if not result.ok:
        print(result.summary(), flush=True)
    return result
