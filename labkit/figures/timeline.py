"""Horovod's timeline (``HOROVOD_TIMELINE=FILE``) read as a stream and drawn with matplotlib.

    tl = read("timeline.json")          # bounded memory, whatever the file's length
    print(tl.summary())                 # phases, fused collectives, who the ranks waited for
    fig = figure(tl)                    # a matplotlib Figure: one lane per rank

The file is a JSON array of Chrome trace events written by the coordinator (rank 0): one trace
"pid" per tensor; nested B/E phases (``NEGOTIATE_ALLREDUCE``, then ``ALLREDUCE`` holding
``MEMCPY_IN_FUSION_BUFFER``, ``MPI_ALLREDUCE``/``GLOO_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER``); inside a
negotiation an ``X`` event named after a rank marks when that rank said it was ready. Ranks report
readiness only the first time a tensor is negotiated unless the response cache is off
(``HOROVOD_CACHE_CAPACITY=0``). The array is often unterminated (a job that was cut): the reader
decodes event by event and stops at the last complete one. Memory: the whole-run totals, the
last ``keep`` collectives (tensors reduced together are merged into one), and at most ``max_tensors``
tensor names.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from labkit.figures import plot

TOP = {"NEGOTIATE_ALLREDUCE": "negotiate", "NEGOTIATE_BROADCAST": "negotiate", "NEGOTIATE_ALLGATHER": "negotiate",
       "ALLREDUCE": "allreduce", "BROADCAST": "broadcast", "ALLGATHER": "allgather"}
COLOURS = {"negotiate": "#f2b134", "allreduce": "#2b7bb9", "broadcast": "#7a5195", "allgather": "#59a14f",
           "wait": "#d62728"}


def events(path: str | Path, chunk: int = 1 << 16, state: dict | None = None) -> Iterator[dict]:
    """The events of a trace file one by one; a cut last event (or a missing ``]``) ends the stream
    (then ``state["cut"]`` is True)."""
    state = {} if state is None else state
    state["cut"] = False
    decoder = json.JSONDecoder()
    buf, pos, eof, closed = "", 0, False, False
    with open(path, encoding="utf-8", errors="replace") as f:
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,[]":
                closed = closed or buf[pos] == "]"
                pos += 1
            if pos >= len(buf) - 1 and not eof or pos > chunk:
                buf, pos = buf[pos:], 0
                more = f.read(chunk)
                eof = not more
                buf += more
                if more:
                    continue
            if pos >= len(buf):
                state["cut"] = not closed
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    state["cut"] = True  # an event cut in the middle: the file ends before it
                    return
                more = f.read(chunk)
                eof = not more
                buf = buf[pos:] + more
                pos = 0
                continue
            pos, closed = end, False
            if isinstance(obj, dict):
                yield obj


@dataclass
class Collective:
    """One collective phase of one or more tensors that ran together (fused when ``tensors`` > 1)."""

    phase: str  # negotiate, allreduce, broadcast, allgather
    start: float  # seconds since the trace began
    end: float
    tensors: int = 1
    ready: dict[int, float] = field(default_factory=dict)  # negotiation: when each rank was ready

    def __post_init__(self) -> None:
        self.first_end = self.end

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """What the picture and the summary need from a trace file."""

    path: str = ""
    events: int = 0
    truncated: bool = False
    tensor_names: dict[int, str] = field(default_factory=dict)
    dropped_tensors: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=4000))
    totals: Counter = field(default_factory=Counter)  # seconds per phase (each collective once)
    counts: Counter = field(default_factory=Counter)  # collectives per phase
    fused: Counter = field(default_factory=Counter)  # tensors per reduction -> how often
    ranks: set = field(default_factory=set)
    last_ready: Counter = field(default_factory=Counter)  # rank -> negotiations it was the last to join
    waited: defaultdict = field(default_factory=lambda: defaultdict(float))  # rank -> s it waited for the last
    judged: int = 0  # negotiations with every rank's readiness

    def summary(self) -> str:
        lines = [f"Horovod timeline {self.path}: {self.events} events"
                 + (" (cut: the last event was incomplete or the array unterminated)" if self.truncated else "")]
        for phase in sorted(self.counts):
            n, s = self.counts[phase], self.totals[phase]
            lines.append(f"  {phase:<10} {n:>6} x, {s:8.3f} s in all, {1000 * s / n:8.2f} ms each")
        if self.fused:
            many = sum(c for k, c in self.fused.items() if k > 1)
            total = sum(self.fused.values())
            per = sum(k * c for k, c in self.fused.items()) / total
            lines.append(f"  fusion: {many} of {total} reductions carried several tensors "
                         f"(up to {max(self.fused)}; {per:.1f} per reduction)")
        lines.append(f"  tensors: {len(self.tensor_names)}" + (f" (+{self.dropped_tensors} not kept)"
                                                              if self.dropped_tensors else ""))
        if self.judged:
            rank, n = self.last_ready.most_common(1)[0]
            others = ", ".join(f"rank {r} waited {self.waited[r]:.3f} s" for r in sorted(self.ranks) if r != rank)
            lines.append(f"  last ready: rank {rank} in {n} of {self.judged} negotiations; {others}")
        else:
            lines.append("  no negotiation shows every rank's readiness (set HOROVOD_CACHE_CAPACITY=0 to see them)")
        return "\n".join(lines)

    def straggler(self) -> tuple[int, float] | None:
        """The rank most often last to be ready and the seconds the others waited per negotiation (median)."""
        if not self.judged:
            return None
        rank = self.last_ready.most_common(1)[0][0]
        waits = [max(c.ready.values()) - min(c.ready.values()) for c in self.recent
                 if c.phase == "negotiate" and len(c.ready) == len(self.ranks)
                 and max(c.ready, key=c.ready.get) == rank]
        return rank, statistics.median(waits) if waits else 0.0


def read(path: str | Path, keep: int = 4000, max_tensors: int = 10000) -> Timeline:
    """Read a timeline file as a stream (see the module's text)."""
    tl = Timeline(str(path), recent=deque(maxlen=keep))
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    ready: dict[int, dict[int, float]] = {}
    group: dict[str, Collective] = {}  # phase -> the collective being closed (fused tensors overlap in time)
    origin: float | None = None
    state: dict = {}
    for ev in events(path, state=state):
        tl.events += 1
        pid, ph, ts = ev.get("pid"), ev.get("ph"), ev.get("ts")
        if ph == "M":
            if ev.get("name") == "process_name" and "name" in ev.get("args", {}):
                if len(tl.tensor_names) < max_tensors:
                    tl.tensor_names[pid] = ev["args"]["name"]
                else:
                    tl.dropped_tensors += 1
            continue
        if not isinstance(ts, (int, float)) or not isinstance(pid, int):
            continue
        t = ts / 1e6
        origin = t if origin is None else origin
        if ph == "B":
            stacks[pid].append((ev.get("name", ""), t))
        elif ph == "X" and str(ev.get("name", "")).isdigit():
            rank = int(ev["name"])
            tl.ranks.add(rank)
            ready.setdefault(pid, {})[rank] = t - origin
        elif ph == "E" and stacks[pid]:
            name, start = stacks[pid].pop()
            if not stacks[pid]:
                del stacks[pid]
            phase = TOP.get(name)
            if phase:  # tensors negotiated or reduced together start before the first of them ends
                c = group.get(phase)
                mine = ready.pop(pid, {}) if phase == "negotiate" else {}
                if c is not None and start - origin < c.first_end:
                    c.tensors += 1
                    c.end = max(c.end, t - origin)
                    for r, when in mine.items():  # a rank is ready once it asked for all of them
                        c.ready[r] = max(when, c.ready.get(r, when))
                else:
                    if c is not None:
                        _closed(tl, c)
                    group[phase] = Collective(phase, start - origin, t - origin, 1, mine)
    for c in group.values():
        _closed(tl, c)
    tl.truncated = state["cut"]
    return tl


def _closed(tl: Timeline, c: Collective) -> None:
    tl.totals[c.phase] += c.seconds
    tl.counts[c.phase] += 1
    if c.phase == "allreduce":
        tl.fused[c.tensors] += 1
    tl.recent.append(c)
    if c.phase == "negotiate" and len(c.ready) >= 2 and len(c.ready) == len(tl.ranks):
        tl.judged += 1
        last = max(c.ready, key=c.ready.get)
        tl.last_ready[last] += 1
        for r, t in c.ready.items():
            tl.waited[r] += c.ready[last] - t


def figure(tl: Timeline, last: float | None = None, ranks: int | None = None) -> Figure:
    """One lane per rank: each rank's wait in a negotiation (from its readiness to the end: red), the
    negotiation itself and the collectives (fused ones marked with their tensor count); the last
    ``last`` seconds of what was kept (default: all of it)."""
    n = ranks or (max(tl.ranks) + 1 if tl.ranks else 1)
    kept = sorted(tl.recent, key=lambda c: c.start)
    if kept and last:
        kept = [c for c in kept if c.end >= kept[-1].end - last]
    plot._notebook_png()  # a cell's value shows as a picture in Jupyter
    fig = Figure(figsize=(10, 1.6 + 0.6 * n), layout="constrained")
    ax = fig.add_subplot()
    lanes: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    labels = []
    for c in kept:
        for rank in range(n):
            if c.phase == "negotiate" and rank in c.ready:
                lanes[(rank, "negotiate")].append((c.start, c.ready[rank] - c.start))
                lanes[(rank, "wait")].append((c.ready[rank], c.end - c.ready[rank]))
            else:
                lanes[(rank, c.phase)].append((c.start, c.seconds))
        if c.tensors > 1 and c.phase != "negotiate":
            labels.append((c.start + c.seconds / 2, c.tensors))
    for (rank, phase), bars in lanes.items():
        ax.broken_barh([(s, max(w, 1e-5)) for s, w in bars], (rank - 0.35, 0.7), facecolors=COLOURS[phase],
                       label=phase, hatch="//" if phase == "wait" else None)
    if labels:  # a row of marks above the ranks: collectives that carried several tensors (fused)
        ax.scatter([x for x, _ in labels], [-0.75] * len(labels), marker="v", s=18, c="k", label="fused")
        for x, k in labels[:: max(1, len(labels) // 25)]:
            ax.annotate(str(k), (x, -0.95), fontsize=7, ha="center", va="bottom")
    handles = {h.get_label(): h for h in ax.get_legend_handles_labels()[0]}
    names = {"wait": "waiting for the last rank", "fused": "fused (tensors)"}
    fig.legend(handles.values(), [names.get(k, k) for k in handles], loc="outside lower center", fontsize=8,
               ncol=len(handles))
    ax.set_yticks([-0.75, *range(n)], ["fused", *(f"rank {r}" for r in range(n))])
    ax.set_ylim(-1.2, n - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the timeline began")
    ax.set_title(f"Horovod timeline: {len(kept)} phases" + (" (file cut)" if tl.truncated else ""), fontsize=10)
    return fig
