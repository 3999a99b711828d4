"""Horovod's timeline read as a stream, drawn, and a straggler named
(labkit.figures.timeline, labkit.measure.timeline_straggler).

Fixtures (tests/fixtures/timeline/): a 2-rank trace in Horovod 0.28's layout with the response cache off:
3 gradient tensors, 4 steps, tensors 0 and 1 fused, tensor 2 alone; from step 1 on rank 1 is ready
32 ms after rank 0. ``unterminated.json`` lacks the closing ``]``; ``cut_mid_event.json`` stops in the
middle of the last event.
"""

from __future__ import annotations

import io
import json
import time
import tracemalloc
from pathlib import Path

import pytest
from helpers import paths
from matplotlib.figure import Figure

from labkit.figures import timeline
from labkit.launching.jobspec import JobSpec
from labkit.measure import timeline_straggler

FIX = paths.FIXTURES / "timeline"


def test_a_complete_trace_gives_phases_fusion_and_the_late_rank() -> None:
    tl = timeline.read(FIX / "straggler_rank1.json")
    assert tl.events == len(json.loads((FIX / "straggler_rank1.json").read_text()))
    assert not tl.truncated
    assert tl.counts == {"negotiate": 4, "allreduce": 8}
    assert tl.fused == {2: 4, 1: 4}  # per step: one reduction of 2 tensors, one of 1
    assert tl.ranks == {0, 1} and tl.judged == 4
    assert tl.last_ready == {1: 3, 0: 1}
    rank, wait = tl.straggler()
    assert rank == 1 and wait == pytest.approx(0.032, abs=1e-3)
    assert len(tl.tensor_names) == 3
    text = tl.summary()
    assert "last ready: rank 1 in 3 of 4 negotiations" in text and "4 of 8 reductions" in text


def test_an_unterminated_array_reads_to_its_last_event() -> None:
    tl = timeline.read(FIX / "unterminated.json")
    assert tl.truncated and tl.events == 152
    assert tl.counts == {"negotiate": 4, "allreduce": 8} and tl.straggler()[0] == 1
    assert "cut" in tl.summary()


def test_an_event_cut_in_the_middle_is_left_out() -> None:
    tl = timeline.read(FIX / "cut_mid_event.json")
    assert tl.truncated and tl.events == 151
    assert tl.counts["negotiate"] == 4 and tl.straggler()[0] == 1


@pytest.mark.parametrize("chunk", [1, 7, 100, 1 << 16])
def test_events_are_the_same_whatever_the_read_size(chunk: int) -> None:
    whole = json.loads((FIX / "straggler_rank1.json").read_text())
    assert list(timeline.events(FIX / "straggler_rank1.json", chunk=chunk)) == whole


def _long_trace(path: Path, steps: int, tensors: int = 8) -> int:
    """A trace of ``steps`` steps of ``tensors`` tensors each, cut at the end; its size in bytes."""
    with open(path, "w") as f:
        f.write("[\n")
        for pid in range(1, tensors + 1):
            meta = {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"grad_{pid}"}}
            f.write(json.dumps(meta) + ",\n")
        buf = io.StringIO()
        for step in range(steps):
            t = 1000 + step * 50000
            for pid in range(1, tensors + 1):
                buf.write(f'{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": {t}, "pid": {pid}}},'
                          f'{{"ph": "X", "name": "0", "ts": {t}, "pid": {pid}, "dur": 0}},'
                          f'{{"ph": "X", "name": "1", "ts": {t + 900 + step % 7}, "pid": {pid}, "dur": 0}},'
                          f'{{"ph": "E", "ts": {t + 1000}, "pid": {pid}}},'
                          f'{{"ph": "B", "name": "ALLREDUCE", "ts": {t + 1100}, "pid": {pid}}},')
            for pid in range(1, tensors + 1):
                buf.write(f'{{"ph": "E", "ts": {t + 3000 + pid}, "pid": {pid}, "args": {{"dtype": "float32"}}}},\n')
            if step % 500 == 0:
                f.write(buf.getvalue())
                buf = io.StringIO()
        f.write(buf.getvalue() + '{"ph": "B", "name": "ALLRED')
    return path.stat().st_size


@pytest.mark.slow  # 2 s or more: make test, not the 90 s of make test-fast
def test_a_huge_trace_is_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "long.json"
    size = _long_trace(path, 3200)
    assert size > 8 << 20
    tracemalloc.start()
    try:
        tl = timeline.read(path, keep=1000, max_tensors=4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tl.counts == {"negotiate": 3200, "allreduce": 3200} and tl.fused == {8: 3200}
    assert tl.truncated and len(tl.recent) == 1000
    assert len(tl.tensor_names) == 4 and tl.dropped_tensors == 4
    assert tl.straggler()[0] == 1
    assert peak < 2 << 20, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB file"


def test_the_picture_has_a_lane_per_rank_and_marks_fusion(tmp_path: Path) -> None:
    tl = timeline.read(FIX / "straggler_rank1.json")
    start = time.perf_counter()
    fig = timeline.figure(tl)
    fig.savefig(tmp_path / "tl.png", dpi=60)
    assert time.perf_counter() - start < 20  # seconds on a loaded 2-core machine
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fused", "rank 0", "rank 1"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"negotiate", "allreduce", "waiting for the last rank", "fused (tensors)"} <= set(legend)
    assert sorted(t.get_text() for t in ax.texts) == ["2"] * 4  # the four fused reductions, labelled
    assert (tmp_path / "tl.png").stat().st_size > 1000


def _logs(folder: Path, compute: dict[int, float], comm: dict[int, float], steps: int = 10) -> None:
    for rank in compute:
        lines = [f"noise from rank {rank}"] + [
            "STEP " + json.dumps({"rank": rank, "step": s, "compute_s": compute[rank], "comm_s": comm[rank]})
            for s in range(steps)]
        (folder / f"rank.{rank}.log").write_text("\n".join(lines) + "\n")


def test_the_diagnosis_names_the_slow_rank_and_the_wait(tmp_path: Path) -> None:
    _logs(tmp_path, {0: 0.040, 1: 0.130, 2: 0.041}, {0: 0.095, 1: 0.004, 2: 0.093})
    d = timeline_straggler.diagnose(tmp_path, 3, FIX / "straggler_rank1.json", slowed=1)
    assert d.straggler == 1 and d.wait_s == pytest.approx(0.090)
    text = str(d)
    assert "straggler: rank 1; the others wait 90.0 ms per step" in text and "diagnosed" in text
    assert "timeline: rank 1 is the last ready in 3 of 4 negotiations" in text
    _logs(tmp_path, {0: 0.130, 1: 0.040}, {0: 0.004, 1: 0.095})
    assert timeline_straggler.diagnose(tmp_path, 2, slowed=1).straggler == 0
    assert "NOT what the step times say" in str(timeline_straggler.diagnose(tmp_path, 2, slowed=1))


@pytest.mark.slow
@pytest.mark.heavy  # make test names a straggler end to end in lab 8 (tests/browser/test_notebook_communication.py)
def test_a_slowed_rank_is_named_by_the_step_times_and_the_timeline(tmp_path: Path) -> None:
    start = time.perf_counter()
    d = timeline_straggler.run(np=2, steps=300, slow=1, share=0.3,
                               job=JobSpec(log_dir=tmp_path / "logs", timeout=400, quiet=True))
    print(d, d.timeline.summary() if d.timeline else "", f"{time.perf_counter() - start:.0f} s", sep="\n")
    assert d.straggler == 1
    assert d.timeline is not None and d.timeline.straggler()[0] == 1
    assert d.wait_s > 0.02
    drawn = time.perf_counter()
    d.figure().savefig(tmp_path / "straggler.png", dpi=60)
    assert time.perf_counter() - drawn < 20
