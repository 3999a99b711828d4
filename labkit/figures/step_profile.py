"""A rank's TensorFlow profile read as the time each training step spent computing, all-reducing and waiting for
its input, and drawn (lab 9).

    prof = read_folder("profile")      # the newest trace under --profile-dir, bounded
    print(prof.summary())              # per step: compute, all-reduce in flight and exposed, input, other
    fig = figure(prof)                 # a matplotlib Figure: the typical step's lanes and every step's shares

``tf.profiler.experimental.start(DIR)`` ... ``stop()`` (also what Keras's TensorBoard callback with
``profile_batch`` and ``tf.profiler.experimental.Profile`` do) writes ``DIR/plugins/profile/<time>/<host>.xplane.pb``:
an XSpace protocol buffer with one plane per device. On the host's plane (``/host:CPU``) each thread is a line of
timed events:

* ``train_function`` on the thread that called ``fit``: one training step (``steps_per_execution`` of them);
* on TensorFlow's executor threads (lines ``tf_Compute/...``) each op kernel, named ``op_name:OpType``;
* an asynchronous kernel as two events, ``ExecutorState::ProcessAsync::Start`` where it began (its ``kernel_type``
  stat names the op: ``HorovodAllreduce``...) and ``...::Done`` on the thread that finished it (Horovod's background
  thread, once the all-reduce came back), linked by the ``_p``/``_c`` ids of the two;
* ``IteratorGetNextOp::DoCompute``: the step waiting for its batch from tf.data.

A step's **compute** is the union of its op kernels' intervals (on a GPU, of every kernel on the device's plane,
NCCL's all-reduce kernels among them, so that the exposed part reads low there: written for GPUs, unverified on
one), **all-reduce** the union of the Horovod collectives' intervals from start to done, **exposed** the part of it
when no kernel ran, **input** the waits for a batch, and **other** the rest of the step (Python, the framework,
idle). The trace is written by the learner's process: it is opened without following links and only as a regular
file, read with a size and an event cap, through its protocol buffer only, in passes that stay linear however many
steps and events it holds; a file that does not parse is named.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
import stat
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import message
from matplotlib.figure import Figure

from labkit.figures import plot

MAX_BYTES = 32 * 2**20  # of one trace: three steps of the course's model take 0.35 MiB
MAX_EVENTS = 1_000_000  # of one trace's host plane (the course's three steps: about 8,700)
PATTERN = "plugins/profile/*/*.xplane.pb"  # under the folder given to tf.profiler.experimental.start
STEP = "train_function"  # Keras's traced training step, as the profiler names its call
ASYNC_START, ASYNC_DONE = "ExecutorState::ProcessAsync::Start", "ExecutorState::ProcessAsync::Done"
INPUT = "IteratorGetNextOp::DoCompute"
COLLECTIVE = "Horovod"  # the kernel types of Horovod's collectives begin so (HorovodAllreduce, HorovodGroupedAllreduce)
KERNEL_LINES = ("tf_Compute", "tf_inter_op")  # TensorFlow's executor threads on the host
PARTS = ("compute", "exposed", "input", "other")
COLOURS = {"compute": "#2b7bb9", "allreduce": "#f2b134", "exposed": "#d62728", "input": "#59a14f",
           "other": "#bbbbbb"}
XPLANE = "tsl/profiler/protobuf/xplane_pb2.py"  # TensorFlow's generated XSpace module, inside its package


class ProfileError(ValueError):
    """A trace that is missing, too large or does not parse."""


Span = tuple[float, float]  # seconds from the first step's start


@dataclass(frozen=True)
class Step:
    """One training step of the trace: its window and what filled it, in seconds."""

    start: float
    wall: float
    compute: float
    allreduce: float
    exposed: float
    input: float
    collectives: int  # Horovod collectives started in the step

    @property
    def other(self) -> float:
        return max(0.0, self.wall - self.compute - self.exposed - self.input)

    def share(self, part: str) -> float:
        return getattr(self, part) / self.wall if self.wall > 0 else 0.0


@dataclass(frozen=True)
class Lanes:
    """What ran when in one step, for the picture: kernels, collectives in flight and input waits."""

    compute: tuple[Span, ...]
    allreduce: tuple[Span, ...]
    input: tuple[Span, ...]


@dataclass(frozen=True)
class Profile:
    """The training steps of one trace file, in order; ``lanes`` of the typical (median) step."""

    path: str
    host: str
    device: str  # "cpu", or the GPU plane whose kernels were counted as compute
    steps: tuple[Step, ...]
    lanes: Lanes | None

    def typical(self) -> Step | None:
        """The step of median wall time (the first, which traces the graph, is left out when there are more)."""
        steps = self.steps[1:] if len(self.steps) > 2 else self.steps
        if not steps:
            return None
        ordered = sorted(steps, key=lambda s: s.wall)
        return ordered[len(ordered) // 2]

    def mean(self, part: str) -> float:
        return statistics.fmean(getattr(s, part) for s in self.steps) if self.steps else 0.0

    def summary(self) -> str:
        if not self.steps:
            return f"{self.path}: no training step in the trace"
        rows = [f"{len(self.steps)} training step(s) profiled on {self.host} ({self.device}), in ms:",
                f"  {'step':>4}{'wall':>9}{'compute':>9}{'all-reduce':>12}{'exposed':>9}{'input':>8}{'other':>8}"]
        for i, s in enumerate(self.steps, 1):
            rows.append(f"  {i:>4}{1e3 * s.wall:>9.1f}{1e3 * s.compute:>9.1f}{1e3 * s.allreduce:>12.1f}"
                        f"{1e3 * s.exposed:>9.1f}{1e3 * s.input:>8.1f}{1e3 * s.other:>8.1f}")
        t = self.typical()
        if t is not None:
            rows.append("Typical step: " + ", ".join(f"{p} {100 * t.share(p):.0f}%" for p in PARTS)
                        + f" of {1e3 * t.wall:.1f} ms; collectives in flight {1e3 * t.allreduce:.1f} ms.")
        return "\n".join(rows)


def xplane_module() -> ModuleType:
    """TensorFlow's generated XSpace module, loaded from its file without importing TensorFlow (seconds) itself."""
    name = "labkit_xplane_pb2"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("tensorflow")
    where = [Path(p) / XPLANE for p in (spec.submodule_search_locations or [])] if spec else []
    found = next((p for p in where if p.is_file()), None)
    if found is None:
        raise ProfileError(f"TensorFlow's XSpace module ({XPLANE}) was not found: reading a profile needs "
                           "TensorFlow installed")
    loader_spec = importlib.util.spec_from_file_location(name, found)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def traces(folder: str | Path) -> list[Path]:
    """The trace files under ``folder`` (a profiler's log folder), oldest run first; links are not followed."""
    root = Path(folder)
    if not root.is_dir() or root.is_symlink():
        return []
    found = [p for p in root.glob(PATTERN) if _no_link(p, root) and p.is_file()]
    return sorted(found, key=lambda p: (p.parent.name, p.name))


def _no_link(path: Path, root: Path) -> bool:
    """Whether no part of ``path`` below ``root`` is a symbolic link."""
    while path != root and path != path.parent:
        if path.is_symlink():
            return False
        path = path.parent
    return True


def read_folder(folder: str | Path) -> Profile:
    """The newest trace under ``folder``; :class:`ProfileError` when there is none."""
    found = traces(folder)
    if not found:
        raise ProfileError(f"{folder}: no profile (no {PATTERN} under it)")
    return read(found[-1])


def read(path: str | Path) -> Profile:
    """The training steps of one ``.xplane.pb`` file."""
    path = Path(path)
    try:  # the file as it is when opened: not through a link, never a FIFO that would block, at most MAX_BYTES
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ProfileError(f"{path}: not a regular file")
            if info.st_size > MAX_BYTES:
                raise ProfileError(f"{path}: {info.st_size} bytes, more than the {MAX_BYTES} a profile of a few steps "
                                   "takes")
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ProfileError(f"{path}: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ProfileError(f"{path}: more than the {MAX_BYTES} bytes a profile of a few steps takes")
    space = xplane_module().XSpace()
    try:
        space.ParseFromString(data)
    except (message.DecodeError, ValueError, RuntimeError) as e:  # what a damaged or hostile file provokes
        raise ProfileError(f"{path}: not a TensorFlow profile ({type(e).__name__})") from None
    return _profile(space, str(path))


def _events(plane: Any, lines: Iterable[Any] | None = None) -> Iterable[tuple[str, float, float, Any, Any]]:
    """(name, start, end, event, plane) of every event of ``plane`` (seconds, absolute), line by line."""
    names = plane.event_metadata
    for line in plane.lines if lines is None else lines:
        base = line.timestamp_ns * 1e-9
        for e in line.events:
            start = base + e.offset_ps * 1e-12
            yield names[e.metadata_id].name, start, start + e.duration_ps * 1e-12, e, line


def _stats(plane: Any, event: Any) -> dict[str, Any]:
    """An event's stats by name; a reference to a name is resolved to it."""
    out: dict[str, Any] = {}
    meta = plane.stat_metadata
    for s in event.stats:
        kind = s.WhichOneof("value")
        value = getattr(s, kind) if kind else None
        out[meta[s.metadata_id].name] = meta[value].name if kind == "ref_value" else value
    return out


def _profile(space: Any, path: str) -> Profile:
    host = next((p for p in space.planes if p.name == "/host:CPU"), None)
    if host is None:
        return Profile(path, _host_name(space), "cpu", (), None)
    if sum(len(line.events) for line in host.lines) > MAX_EVENTS:
        raise ProfileError(f"{path}: more than {MAX_EVENTS} events: profile a few steps")
    windows: list[Span] = []
    kernels: list[Span] = []
    waits: list[Span] = []
    started: dict[int, float] = {}
    done: dict[int, float] = {}
    for name, start, end, event, line in _events(host):
        if name == STEP:
            windows.append((start, end))
        elif name == INPUT:
            waits.append((start, end))
        elif name == ASYNC_START:
            st = _stats(host, event)
            if str(st.get("kernel_type", "")).startswith(COLLECTIVE) and isinstance(st.get("_p"), int):
                started[st["_p"]] = start
        elif name == ASYNC_DONE:
            st = _stats(host, event)
            if isinstance(st.get("_c"), int):
                done[st["_c"]] = end
        elif line.name.startswith(KERNEL_LINES) and ":" in name and "::" not in name:
            kernels.append((start, end))
    device = "cpu"
    gpus = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    if gpus:  # the kernels a GPU ran are the compute (NCCL's all-reduce kernels among them); the host's launch them
        device = gpus[0].name
        if sum(len(line.events) for line in gpus[0].lines) > MAX_EVENTS:
            raise ProfileError(f"{path}: more than {MAX_EVENTS} events on {device}: profile a few steps")
        kernels = [(s, e) for _, s, e, _, _ in _events(gpus[0])]
    collectives = [(t, done[k]) for k, t in started.items() if k in done]
    windows.sort()
    origin = windows[0][0] if windows else 0.0
    spans = Spans(_union(kernels), _union(collectives), _union(waits), sorted(a for a, _ in collectives))
    steps = tuple(_step(w, spans, origin) for w in windows)
    prof = Profile(path, _host_name(space), device, steps, None)
    t = prof.typical()
    if t is None:
        return prof
    w = (origin + t.start, origin + t.start + t.wall)
    lanes = Lanes(*(tuple((a - w[0], b - w[0]) for a, b in _within(union, w))
                    for union in (spans.kernels, spans.collectives, spans.waits)))
    return Profile(path, prof.host, device, steps, lanes)


def _host_name(space: Any) -> str:
    return space.hostnames[0] if space.hostnames else "?"


@dataclass(frozen=True)
class Spans:
    """A trace's intervals, each kind merged into disjoint sorted spans, and when each collective began."""

    kernels: list[Span]
    collectives: list[Span]
    waits: list[Span]
    starts: list[float]


def _within(union: list[Span], window: Span) -> list[Span]:
    """The parts of the disjoint, sorted ``union`` inside ``window`` (found by bisection: a trace may hold many)."""
    lo, hi = window
    out = []
    for a, b in union[bisect.bisect_right(union, lo, key=lambda span: span[1]):]:
        if a >= hi:
            break
        out.append((max(a, lo), min(b, hi)))
    return out


def _union(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans: Iterable[Span]) -> float:
    return sum(b - a for a, b in spans)


def _minus(spans: list[Span], cut: list[Span]) -> list[Span]:
    """The parts of the (disjoint, sorted) ``spans`` outside the (disjoint, sorted) ``cut``, in one pass of both."""
    out: list[Span] = []
    j = 0
    for a, b in spans:
        while j < len(cut) and cut[j][1] <= a:
            j += 1
        pos, k = a, j
        while k < len(cut) and cut[k][0] < b:
            c, d = cut[k]
            if c > pos:
                out.append((pos, c))
            pos = max(pos, d)
            k += 1
        if pos < b:
            out.append((pos, b))
    return out


def _step(window: Span, spans: Spans, origin: float) -> Step:
    compute = _within(spans.kernels, window)
    reduce = _within(spans.collectives, window)
    wait = _minus(_minus(_within(spans.waits, window), compute), reduce)
    exposed = _minus(reduce, compute)
    begun = bisect.bisect_left(spans.starts, window[1]) - bisect.bisect_left(spans.starts, window[0])
    return Step(window[0] - origin, window[1] - window[0], _length(compute), _length(reduce), _length(exposed),
                _length(wait), begun)


def figure(prof: Profile) -> Figure:
    """Left: the typical step's lanes (kernels, collectives in flight, input waits) over its time; right: each
    step's wall time split into compute, exposed all-reduce, input and other."""
    plot._notebook_png()  # a cell's value shows as a picture in Jupyter
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    t = prof.typical()
    if t is None or prof.lanes is None:
        left.text(0.5, 0.5, "no training step in the trace", ha="center", va="center")
    else:
        rows = (("compute", prof.lanes.compute), ("allreduce", prof.lanes.allreduce), ("input", prof.lanes.input))
        for y, (part, spans) in enumerate(rows):
            left.broken_barh([(1e3 * a, max(1e3 * (b - a), 0.02)) for a, b in spans], (y - 0.35, 0.7),
                             facecolors=COLOURS[part])
        left.set_yticks(range(3), ["kernels", "all-reduce\nin flight", "waiting\nfor input"])
        left.set_xlim(0, 1e3 * t.wall)
        left.invert_yaxis()
        left.set_xlabel("ms since the step began")
        left.set_title(f"the typical step ({1e3 * t.wall:.0f} ms)", fontsize=10)
    bottom = [0.0] * len(prof.steps)
    x = list(range(1, len(prof.steps) + 1))
    names = {"compute": "compute", "exposed": "all-reduce, nothing else running", "input": "input", "other": "other"}
    for part in PARTS:
        heights = [1e3 * getattr(s, part) for s in prof.steps]
        right.bar(x, heights, bottom=bottom, color=COLOURS[part], label=names[part])
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    right.set_xlabel("profiled step")
    right.set_ylabel("ms")
    right.set_xticks(x)
    right.legend(fontsize=8, loc="lower right")
    right.set_title("where each step's time went", fontsize=10)
    fig.suptitle(f"Profile of {prof.host} ({prof.device}): {Path(prof.path).parent.name}", fontsize=10)
    return fig
