"""Where a process is: Python stacks dumped by :mod:`faulthandler`, and what they say.

In a probed process :func:`install` makes the interpreter write the stacks of all its
threads to files, from C, without the GIL (so a busy loop or a blocking call cannot
prevent it):

* ``STEM.term.txt`` when the process gets SIGTERM (then it dies as it would have);
* ``STEM.usr1.txt`` on every SIGUSR1 (the process goes on);
* ``STEM.timer.txt`` once, ``budget`` seconds after start: the fallback for a script that
  overrides or ignores the signals;
* ``STEM.bound.txt`` when :func:`dump` is called (from another thread of the process, e.g. a watchdog).

:func:`where` reads the newest dump back and says where the main thread was: in the
learner's own code (its file, line, function and source text), in a collective operation
(Horovod or tf.distribute frames), in ``Model.fit``'s training loop, or elsewhere.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import signal
import sysconfig
from pathlib import Path
from typing import Any

KINDS = ("term", "usr1", "timer", "bound")  # newest evidence first when several exist
_FILES: list[Any] = []  # kept open for faulthandler, which writes to their descriptors
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')
COLLECTIVE = ("/horovod/", "/distribute/collective", "/distribute/cross_device", "/distribute/coordinator/",
              "/distribute/multi_worker", "collective_ops")
TRAINING = ("/engine/training.py", "/engine/data_adapter.py", "/trainers/")
NOT_OWN = ("__autograph_generated", "/site-packages/", "/dist-packages/", "/labkit/")
TRACING = ("/framework/func_graph.py", "/polymorphic_function/tracing_compilation.py")
_LIBS = tuple(p for p in {sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
              if p)


def install(stem: str | Path, budget: float | None = None) -> None:
    """Dump this process's stacks on SIGTERM, on SIGUSR1, and once after ``budget`` seconds."""
    for kind in KINDS:
        if kind == "bound" or (kind == "timer" and not budget):
            continue
        f = open(f"{stem}.{kind}.txt", "w")  # must stay open for faulthandler
        _FILES.append(f)
        if kind == "term":
            faulthandler.register(signal.SIGTERM, file=f, all_threads=True, chain=True)
        elif kind == "usr1":
            faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
        else:
            faulthandler.dump_traceback_later(max(1.0, float(budget or 0)), repeat=False, file=f, exit=False)


def dump(stem: str | Path, kind: str = "bound") -> None:
    """Write the stacks of all this process's threads to ``STEM.KIND.txt`` now."""
    with open(f"{stem}.{kind}.txt", "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)


def threads(text: str) -> list[list[dict[str, Any]]]:
    """The threads of the last dump in ``text``, each a list of frames, innermost first."""
    out: list[list[dict[str, Any]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            out.append([])
        elif out:
            m = _FRAME.match(line)
            if m:
                out[-1].append({"file": m["file"], "line": int(m["line"]), "function": m["func"].strip()})
    return out


def own(path: str) -> bool:
    """A frame of the learner's code: not the standard library, an installed package or labkit."""
    if path.startswith("<") or any(m in path for m in NOT_OWN):
        return False
    return not any(path.startswith(lib + os.sep) for lib in _LIBS)


def main_thread(dumped: list[list[dict[str, Any]]], runner: str) -> list[dict[str, Any]]:
    """The thread running the script: the one whose stack goes through ``runner`` (e.g. labkit/instrument/start.py)."""
    for frames in dumped:
        if any(f["file"].endswith(runner) for f in frames):
            return frames
    return dumped[-1] if dumped else []


def newest_dump(stem: str | Path) -> tuple[str, str] | None:
    """(kind, text) of the newest non-empty dump written for ``stem``, if any."""
    found = []
    for kind in KINDS:
        p = Path(f"{stem}.{kind}.txt")
        try:
            if p.stat().st_size:
                found.append((p.stat().st_mtime, kind, p.read_text(errors="replace")))
        except OSError:
            continue
    if not found:
        return None
    _, kind, text = max(found, key=lambda t: t[0])
    return kind, text


def where(stem: str | Path, runner: str) -> dict[str, Any] | None:
    """Where the process that dumped to ``stem`` was, or None when it dumped nothing.

    ``kind`` is ``own`` (innermost frame in the learner's code), ``importing``, ``tracing`` (TensorFlow
    building a graph: slow, not stuck), ``collective`` (inside Horovod or a tf.distribute
    collective), ``training`` (inside Model.fit/evaluate) or ``library`` (elsewhere, called
    from the learner's code); ``at`` is the innermost frame of
    the learner's code with its source line, ``inside`` the innermost frame when that is not it.
    """
    dump = newest_dump(stem)
    if dump is None:
        return None
    trigger, text = dump
    frames = main_thread(threads(text), runner)
    if not frames:
        return None
    mine = [f for f in frames if own(f["file"])]
    inner = frames[: frames.index(mine[0])] if mine else frames
    files = " ".join(f["file"] for f in inner)
    if not inner:
        kind = "own"
    elif "<frozen importlib" in files:  # importing a module (TensorFlow takes seconds)
        kind = "importing"
    elif any(t in files for t in TRACING):  # building a graph (Horovod's ops included) is not running it
        kind = "tracing"
    elif any(c in files for c in COLLECTIVE):
        kind = "collective"
    elif any(t in files for t in TRAINING):
        kind = "training"
    else:
        kind = "library"
    out: dict[str, Any] = {"kind": kind, "trigger": trigger}
    if mine:
        at = dict(mine[0])
        at["code"] = linecache.getline(at["file"], at["line"]).strip()[:200]
        out["at"] = at
    if inner:
        out["inside"] = {"file": inner[0]["file"], "line": inner[0]["line"], "function": inner[0]["function"]}
    return out


def describe(at: dict[str, Any]) -> str:
    """``fashion_mnist.py:42 (main): `while True:` `` for a frame from :func:`where`."""
    func = at["function"].strip("<>") if at["function"] == "<module>" else at["function"]
    code = f": `{at['code']}`" if at.get("code") else ""
    return f"{Path(at['file']).name}:{at['line']} ({func}){code}"
