"""What the lab notebooks need besides the lab: a quick mode, no retraining of an unchanged
script, and whether the learner's script is ready for a cell.

The test suite runs every notebook top to bottom in *quick mode* (``LABKIT_NB_QUICK=1``):
each run gets one epoch on tiny data, a cluster launch of an untouched starter is skipped
(the check cell after it runs the script anyway), and an unchanged script is trained once. Learner cells call these
helpers and never mention the mode.

The notebooks never run solutions: a cell that needs steps 1-N of a lab asks :func:`ready`, which runs the
learner's script only when that exact script (by content) has passed those steps in the learner's own checks
(:mod:`labkit.records.checklog`); otherwise the cell shows the course's reference results
(:mod:`labkit.measure.reference`).
"""

from __future__ import annotations

import html
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labkit.core import contract, env, output, proc, progress
from labkit.course import labs
from labkit.course import release as course
from labkit.instrument.start import command as probe_command
from labkit.launching import jobspec, launch
from labkit.measure import reference
from labkit.records import checklog, jobrecord, runs
from labkit.records.runrecord import RunRecord
from labkit.tfdist import cluster

QUICK_VAR = contract.NB_QUICK
TINY = ("--train-size", "256", "--test-size", "128", "--batch-size", "16")
_DONE: dict[tuple, Any] = {}


def show(fig: Any) -> None:
    """Display ``fig`` in the notebook's output (a plain interpreter: nothing; the caller returns it)."""
    try:
        from IPython.display import display
    except ImportError:
        return
    display(fig)


def quick() -> bool:
    """True when the notebook runs in quick mode (the test suite's)."""
    return contract.settings().nb_quick


def args(*given: str, fewest: int = 1, tiny: Sequence[str] = TINY) -> list[str]:
    """The script's arguments; in quick mode with ``fewest`` epochs (default one) on tiny data."""
    out = list(given)
    if not quick():
        return out
    if "--epochs" in out:
        i = out.index("--epochs") + 1
        out[i] = str(min(int(out[i]), max(1, fewest)))
    else:
        out += ["--epochs", str(max(1, fewest))]
    return out + [a for a in tiny if a not in out]


def run(command: Sequence[str], records: str | Path | None = None, **kw: Any) -> Any:
    """:func:`labkit.launching.launch.run`, its record in ``records`` (default: ``runs/runs.jsonl``); in quick mode an
    unchanged script with the same arguments runs once."""
    if records is not None:
        kw["env"] = {**(kw.get("env") or {}), contract.RUNS_FILE: str(Path(records).resolve())}
    script = next((c for c in command if str(c).endswith(".py")), None)
    text = Path(script).read_text() if script and Path(script).is_file() else ""
    key = (text, tuple(command), tuple(sorted((k, repr(v)) for k, v in kw.items())))
    if quick() and key in _DONE:
        return _DONE[key]
    spec, where = jobspec.split(kw)  # a cell's flat options: the job's, and np, launcher, hosts, ...
    _DONE[key] = launch.run(list(command), job=spec, **where)
    return _DONE[key]


def untouched(script: str | Path) -> bool:
    """True while ``script`` is missing or still a lab's starter as handed out (comments and layout aside).

    Comments say nothing: a learner keeps ``TODO`` notes in a finished script, and deletes them in an
    unfinished one. The pristine starters come from the course source or, in a released course, from
    ``.labkit/starters/``."""
    path = Path(script)
    if not path.is_file():
        return True
    lab = labs.by_script(path)
    roots = list(dict.fromkeys([path.resolve().parent.parent, labs.ROOT]))
    return lab is not None and course.not_started(path, lab, roots)


REFERENCE_FOLLOWS = "below, the course's reference results (the same cell, run with the course's finished script)."
SHOWN = 160  # characters of a failed step's message in the line a cell prints


def ready(script: str | Path, lab: str, steps: int) -> bool:
    """True when ``script`` as it is now has passed steps 1..``steps`` of ``lab`` in the learner's checks.

    Otherwise prints one line, naming the first step that failed (with its message, shortened) or that was
    never checked for this version of the script, and says the reference results follow, and when and how
    they were made."""
    ready_now = _ready(script, lab, steps)
    if not ready_now:
        print(f"  ({reference.banner()})")
    return ready_now


def _ready(script: str | Path, lab: str, steps: int) -> bool:
    name, spec = Path(script).name, labs.get(lab)
    where = f"lab {int(spec.notebook.split('_')[0])}"
    wanted = f"steps 1-{steps} of {where}" if steps > 1 else f"step 1 of {where}"
    if untouched(script):
        print(f"{name} is still the starter: finish {wanted} to measure your own; {REFERENCE_FOLLOWS}")
        return False
    got = checklog.standing(script, lab, steps)
    if got.ready:
        return True
    if got.failed is not None:
        message = got.failed.message.splitlines()[0] if got.failed.message else ""
        message = message if len(message) <= SHOWN else message[: SHOWN - 3] + "..."
        print(f"{name}: step {got.step} of {where} failed its last check of this version ({message}): fix it and "
              f"check again; {REFERENCE_FOLLOWS}")
    else:
        print(f"{name}: step {got.step} of {where} ({spec.step_title(got.step)}) was never checked for this "
              f"version of the script: check {wanted} (labkit check {lab} {name} --step {steps}); "
              f"{REFERENCE_FOLLOWS}")
    return False


def new_folder(name: str) -> str:
    """A new, empty ``runs/<name>-<date>-<time>`` folder for one try; earlier tries stay as they were."""
    base = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    path.mkdir(parents=True)
    return str(path)


def run_cluster(command: Sequence[str], **kw: Any) -> Any:
    """:func:`labkit.tfdist.cluster.run` with its summary printed. In quick mode an untouched starter is
    not launched: the check cell after it runs it."""
    script = next((c for c in command if str(c).endswith(".py")), None)
    if quick() and script and untouched(script):
        print(f"quick mode: {script} is still the starter; the check below runs it")
        return None
    result = cluster.run(list(command), *cluster.split(kw))  # a cell's flat options: the tasks', the job's
    print(result.summary())
    return result


def rank_lines(text: str, lines: int = 12) -> list[str]:
    """The last ``lines`` lines of a rank's output as a terminal would show them (bars redrawn, no noise)."""
    out: list[str] = []
    r = output.Renderer(out.append)
    r.feed(text.encode())
    r.close()
    return [line for line in out if line.strip() and not env.is_noise(line)][-lines:]


class Ranks:
    """What a launch ran (the actual command) and every rank's last lines side by side."""

    def __init__(self, command: Sequence[str], outputs: dict[int, list[str]]) -> None:
        self.command, self.outputs = list(command), outputs

    def __repr__(self) -> str:
        parts = [output.command_line(self.command)]
        for rank, rows in self.outputs.items():
            parts += [f"--- rank {rank} ---", *rows] if rows else [f"--- rank {rank}: printed nothing ---"]
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        cols = "".join(
            f"<td style='vertical-align:top;text-align:left'><b>rank {rank}</b><pre style='font-size:11px'>"
            f"{html.escape(chr(10).join(rows)) or '(printed nothing)'}</pre></td>"
            for rank, rows in self.outputs.items())
        return (f"<div><code>{html.escape(output.command_line(self.command))}</code>"
                f"<table><tr>{cols}</tr></table></div>")


def ranks(result: Any, lines: int = 12) -> Ranks:
    """The command a launch really ran and each rank's last ``lines`` lines (rank 0's stream hides the rest)."""
    return Ranks(result.command, {r: rank_lines(result.log(r), lines) for r in range(result.np)})


class Finished:
    """A plain process that ran to its end: exit code, seconds, and its output without start-up noise."""

    def __init__(self, command: list[str], returncode: int | None, seconds: float, text: str, log: Path,
                 record: RunRecord | None = None) -> None:
        self.command, self.returncode, self.seconds, self.text, self.log = command, returncode, seconds, text, log
        self.record = record  # the run record (labkit.records.runrecord): epochs, images/sec, accuracy

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __repr__(self) -> str:
        how = "timed out" if self.returncode is None else f"exit code {self.returncode}"
        return f"{how} after {self.seconds:.0f} s; full output in {self.log}"


def python(script: str | Path, *args: str, log: str | Path | None = None, timeout: float = 7200) -> Finished:
    """Run ``python SCRIPT ARGS`` as one plain process (no launcher), as a terminal would, showing its
    output here without TensorFlow's start-up messages; everything goes to ``log`` too. The run is
    observed and recorded like every launch (``Finished.record``)."""
    shown = ["python", str(script), *map(str, args)]
    path = Path(log) if log else proc.new_log_dir() / "output.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = progress.default_sink()
    sink.line(output.command_line(shown))
    renderer = output.Renderer(sink.line, sink.progress)
    observed, records = path.parent / f"{path.stem}-observed", runs.runs_file().resolve()
    run_env = contract.JobEnv(run_id=runs.new_run_id(), launcher="python", np=1, runs_file=str(records))
    start, started = time.perf_counter(), time.time()
    with proc.Job() as job:
        argv = probe_command("run", str(observed), [sys.executable, *shown[1:]])  # observed for the record
        p = job.spawn(argv, env={"PYTHONUNBUFFERED": "1", **run_env.to_env()}, log=path,
                      on_output=renderer.feed, on_end=renderer.close)
        code = p.wait(timeout)
    seconds = time.perf_counter() - start
    text = "\n".join(rank_lines(path.read_text(errors="replace"), lines=10**9))  # as shown, without noise
    status = "ok" if code == 0 else "timeout" if code is None else "failed"
    end = jobrecord.JobEnd(run_env.run_id or "", shown, "python", 1, None, started, seconds,
                           124 if code is None else code, status, log_dir=path.parent)
    record = jobrecord.finish(end, observed, records)
    done = Finished(shown, code, seconds, text, path, record)
    if not done.ok:
        sink.line(repr(done))
    return done


def tensorflow() -> Any:
    """TensorFlow for a notebook cell, without its native start-up messages (CUDA probing on a CPU
    machine) and with its logger at WARNING (a kernel looks interactive to it, so it would log INFO)."""
    with env.quiet_native_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices()  # probes CUDA: its messages go nowhere
    tf.get_logger().setLevel(logging.WARNING)
    return tf
