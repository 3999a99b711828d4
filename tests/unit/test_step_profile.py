"""labkit.figures.step_profile: a TensorFlow profile read as each training step's compute, all-reduce and input
time, on a recorded trace (rank 0 of a 2-rank Horovod run of lab 9's script, batches 3 to 5) and on traces built
here with known times; hostile files are named, never followed or read whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import paths

from labkit.figures import step_profile as sp

RECORDED = paths.ROOT / "tests" / "fixtures" / "profiles" / "two_ranks_rank0.xplane.pb"


def test_the_xplane_module_loads_from_the_installed_tensorflow_without_importing_it() -> None:
    # fails when TensorFlow moves its generated XSpace module (tsl/profiler/protobuf/xplane_pb2.py)
    code = ("import sys; from labkit.figures import step_profile as sp; m = sp.xplane_module(); "
            "print(m.XSpace.DESCRIPTOR.full_name, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["tensorflow.profiler.XSpace", "False"]


def test_a_recorded_trace_gives_each_steps_compute_and_all_reduce() -> None:
    prof = sp.read(RECORDED)
    assert len(prof.steps) == 3 and prof.device == "cpu"
    for s in prof.steps:
        assert 0 < s.compute <= s.wall and 0 <= s.exposed <= s.allreduce <= s.wall and s.collectives > 0
        assert s.compute + s.exposed + s.input + s.other == pytest.approx(s.wall)
    t = prof.typical()
    assert t is not None and prof.lanes is not None and prof.lanes.compute and prof.lanes.allreduce
    assert "3 training step(s) profiled" in prof.summary() and "Typical step: compute" in prof.summary()
    assert len(sp.figure(prof).axes) == 2


def _space(step: tuple[float, float], kernels: list[tuple[float, float]], reduces: list[tuple[float, float]],
           waits: list[tuple[float, float]]):
    """An XSpace holding one training step and the given kernel, collective and input-wait intervals (ms)."""
    xs = sp.xplane_module().XSpace()
    plane = xs.planes.add(name="/host:CPU")
    xs.hostnames.append("node7")
    names: dict[str, int] = {}
    stats: dict[str, int] = {}

    def meta(name: str) -> int:
        if name not in names:
            names[name] = len(names) + 1
            plane.event_metadata[names[name]].name = name
        return names[name]

    def stat(name: str) -> int:
        if name not in stats:
            stats[name] = len(stats) + 1
            plane.stat_metadata[stats[name]].name = name
        return stats[name]

    def event(line, name: str, span: tuple[float, float], **st: int | str):
        e = line.events.add(metadata_id=meta(name), offset_ps=int(span[0] * 1e9),
                            duration_ps=int((span[1] - span[0]) * 1e9))
        for k, v in st.items():
            s = e.stats.add(metadata_id=stat(k))
            if isinstance(v, str):
                s.ref_value = stat(v)
            else:
                s.int64_value = v
        return e

    main, compute, horovod, data = (plane.lines.add(name=n, timestamp_ns=1000) for n in
                                    ("python", "tf_Compute/1", "python", "tf_data_iterator_get_next/2"))
    event(main, sp.STEP, step)
    for k in kernels:
        event(compute, "grad/Conv2D:Conv2DBackpropFilter", k)
    for i, (a, b) in enumerate(reduces):
        event(compute, sp.ASYNC_START, (a, a + 0.01), kernel_type="HorovodAllreduce", _p=100 + i)
        event(horovod, sp.ASYNC_DONE, (b - 0.01, b), kernel_type="HorovodAllreduce", _c=100 + i)
    for w in waits:
        event(data, sp.INPUT, w)
    return xs


def test_a_built_step_is_split_into_compute_exposed_all_reduce_input_and_other(tmp_path: Path) -> None:
    # a 10 ms step: input wait 0-1, kernels 1-6 and 6.5-7, all-reduces 5-8 and 7.5-9 (so 7-9 exposed)
    xs = _space((0, 10), [(1, 6), (6.5, 7)], [(5, 8), (7.5, 9)], [(0, 1)])
    f = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00" / "node7.xplane.pb"
    f.parent.mkdir(parents=True)
    f.write_bytes(xs.SerializeToString())
    prof = sp.read_folder(tmp_path)
    (s,) = prof.steps
    ms = {k: round(1e3 * getattr(s, k), 3) for k in ("wall", "compute", "allreduce", "exposed", "input", "other")}
    assert ms == {"wall": 10, "compute": 5.5, "allreduce": 4, "exposed": 2.5, "input": 1, "other": 1}
    assert s.collectives == 2 and prof.host == "node7"
    assert [(round(1e3 * a, 3), round(1e3 * b, 3)) for a, b in prof.lanes.allreduce] == [(5, 9)]


def test_an_async_op_that_is_not_horovods_is_no_all_reduce(tmp_path: Path) -> None:
    xs = _space((0, 10), [(0, 5)], [(5, 8)], [])
    for e in xs.planes[0].lines[1].events:
        for s in e.stats:
            if xs.planes[0].stat_metadata[s.metadata_id].name == "kernel_type":
                s.ref_value = next(k for k, m in xs.planes[0].stat_metadata.items() if m.name == "_p")
    f = tmp_path / "t.xplane.pb"
    f.write_bytes(xs.SerializeToString())
    (s,) = sp.read(f).steps
    assert s.allreduce == 0 and s.collectives == 0


def test_hostile_or_missing_traces_are_named_and_links_not_followed(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(sp.ProfileError, match="no profile"):
        sp.read_folder(tmp_path / "none")
    bad = tmp_path / "plugins" / "profile" / "run" / "h.xplane.pb"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(sp.ProfileError, match="not a TensorFlow profile"):
        sp.read_folder(tmp_path)
    monkeypatch.setattr(sp, "MAX_BYTES", 16)
    with pytest.raises(sp.ProfileError, match="more than the 16"):
        sp.read(bad)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "x.xplane.pb").write_bytes(RECORDED.read_bytes())
    linked = tmp_path / "linked"
    (linked / "plugins" / "profile").mkdir(parents=True)
    os.symlink(canary, linked / "plugins" / "profile" / "run")
    os.symlink(RECORDED, tmp_path / "plugins" / "profile" / "run" / "y.xplane.pb")
    deeper = tmp_path / "deeper"
    deeper.mkdir()
    os.symlink(tmp_path / "plugins", deeper / "plugins")  # a link higher up the pattern
    assert sp.traces(linked) == [] and sp.traces(tmp_path) == [bad] and sp.traces(deeper) == []


def test_a_trace_without_a_training_step_has_no_typical_step(tmp_path: Path) -> None:
    xs = _space((0, 10), [], [], [])
    xs.planes[0].lines[0].ClearField("events")
    f = tmp_path / "t.xplane.pb"
    f.write_bytes(xs.SerializeToString())
    prof = sp.read(f)
    assert prof.steps == () and prof.typical() is None and "no training step" in prof.summary()
    assert len(sp.figure(prof).axes) == 2


def test_a_fifo_or_a_link_in_place_of_the_trace_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "t.xplane.pb"
    os.mkfifo(fifo)
    with pytest.raises(sp.ProfileError, match="not a regular file"):
        sp.read(fifo)  # opened without blocking, then refused
    fifo.unlink()
    os.symlink(RECORDED, fifo)
    with pytest.raises(sp.ProfileError):
        sp.read(fifo)


def test_many_steps_and_kernels_are_read_in_a_pass_and_too_many_events_refused(tmp_path: Path, monkeypatch) -> None:
    import time

    steps = [(10.0 * k, 10.0 * k + 9) for k in range(2000)]  # 2000 steps of 9 ms, 10 kernels each
    xs = _space(steps[0], [(a + i * 0.9, a + i * 0.9 + 0.5) for a, _ in steps for i in range(10)],
                [(a + 4, a + 8) for a, _ in steps], [])
    main = xs.planes[0].lines[0]
    for a, b in steps[1:]:
        main.events.add(metadata_id=main.events[0].metadata_id, offset_ps=int(a * 1e9), duration_ps=int((b - a) * 1e9))
    f = tmp_path / "t.xplane.pb"
    f.write_bytes(xs.SerializeToString())
    began = time.perf_counter()
    prof = sp.read(f)
    assert time.perf_counter() - began < 10
    assert len(prof.steps) == 2000 and all(round(1e3 * s.compute, 6) == 5.0 for s in prof.steps)
    monkeypatch.setattr(sp, "MAX_EVENTS", 1000)
    with pytest.raises(sp.ProfileError, match="more than 1000 events"):
        sp.read(f)


def _minus_by_pairs(spans, cut):
    """Every span against every cut: the plain way, to compare with the single pass."""
    out = []
    for a, b in spans:
        pos = a
        for c, d in cut:
            if d <= pos or c >= b:
                continue
            if c > pos:
                out.append((pos, c))
            pos = max(pos, d)
        if pos < b:
            out.append((pos, b))
    return out


def test_the_single_pass_difference_agrees_with_every_pair() -> None:
    import random

    rng = random.Random(7)
    for _ in range(300):
        spans = sp._union((a, a + rng.random()) for a in (rng.random() * 10 for _ in range(rng.randint(0, 12))))
        cut = sp._union((a, a + rng.random()) for a in (rng.random() * 10 for _ in range(rng.randint(0, 12))))
        assert sp._minus(spans, cut) == _minus_by_pairs(spans, cut)
