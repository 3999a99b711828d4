"""Figures in the course's text, rendered from the measurements they quote.

A measured figure in a notebook's text or the instructor guide is written between markers that name it:
``<!--fig:lab6.one_worker_ips-->944<!--/fig-->`` (invisible in JupyterLab and on GitHub). :data:`FIGURES` says how
each name is computed from the course's reference results (``labs/reference/results.json`` and ``runs.jsonl``,
made by :mod:`labkit.measure.reference`; ``communication.json``, by :mod:`labkit.measure.comm_reference`;
``precision.json``, by :mod:`labkit.measure.precision`; ``profile.json`` and its trace, by
:mod:`labkit.measure.profile_reference`; ``large_batch.json``, by :mod:`labkit.measure.large_batch`).
``labkit gen`` (``make gen``) rewrites every marked figure from the files; ``labkit gen --check`` fails when one is
out of date, so results made again cannot leave the text quoting the old ones. A test also fails on a measured-
looking figure outside the markers that is not listed as a prediction, a setting or a computed example
(``tests/unit/test_text_figures.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from labkit.course import labs
from labkit.figures import large_batch as drawn
from labkit.figures import step_profile
from labkit.figures.scaling_model import efficiency
from labkit.measure import large_batch, precision, profile_reference, reference
from labkit.records import sweep

MARK = re.compile(r"<!--fig:(?P<name>[\w.\-]+)-->(?P<value>.*?)<!--/fig-->", re.S)
# The texts whose figures are rendered, from the course's root.
TEXTS = ("labs/03_mirrored_strategy.ipynb", "labs/04_multi_worker.ipynb", "labs/05_parameter_server.ipynb",
         "labs/06_scaling.ipynb", "labs/08_communication.ipynb", "labs/09_at_scale.ipynb", "course/INSTRUCTOR.md")
BATCH = 32  # the lab's images per worker per step
LR_RUNS = {"unscaled": "not scaled", "nowarmup": "×2, no warm-up", "warmup": "×2, warm-up"}
LB_RULES = {"warmup": "linear rule, warm-up", "nowarmup": "linear rule, no warm-up", "unscaled": "not scaled"}
LB_BATCHES = (32, 128, 512, 2048)  # the large-batch reference's global batches (lab 9)
SMALL_GRADIENT, ETHERNET = 0.18e6 * 4, 1.25e9  # the scaling model cell's own cases (lab 6)
FULL_GRADIENT, NVLINK, SHARED = 17.1e6 * 4, 100e9, 5e9


class FigureError(LookupError):
    """A marker that names no figure, or a figure whose measurement is missing."""


class Measured:
    """The reference results in ``folder`` (default: :func:`labkit.measure.reference.folder`), read once."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or reference.folder()

    @cached_property
    def communication(self) -> dict[str, Any]:
        return json.loads((self.folder / "communication.json").read_text())

    def ips(self, name: str, workers: int) -> float:
        point = next((p for p in reference.sweep_of(name, self.folder).points if p.workers == workers), None)
        if point is None or not point.images_per_sec:
            raise FigureError(f"the reference sweep {name!r} has no images/sec at {workers} worker(s)")
        return point.images_per_sec

    def point(self, name: str, workers: int) -> sweep.Point:
        return next(p for p in reference.sweep_of(name, self.folder).points if p.workers == workers)

    def mirrored(self, devices: int) -> float:
        ips = reference.record("mirrored", self.folder, label=f"{devices} device(s)").images_per_sec
        if ips is None:
            raise FigureError(f"the reference run on {devices} device(s) has no images/sec")
        return ips

    def lr_accuracy(self, run: str, epoch: int) -> int:
        accuracy = reference.labelled("learning-rate", self.folder)[LR_RUNS[run]].val_accuracy[epoch - 1]
        if accuracy is None:
            raise FigureError(f"the reference learning-rate run {LR_RUNS[run]!r} has no accuracy after epoch {epoch}")
        return round(100 * accuracy)

    def fusion(self) -> tuple[dict[str, Any], dict[str, Any]]:
        fused, unfused = self.communication["knobs"]["fusion"]["variants"]
        return fused, unfused

    def knob_compression(self) -> tuple[dict[str, Any], dict[str, Any]]:
        f32, f16 = self.communication["knobs"]["compression"]["variants"]
        return f32, f16

    def fp16_runs(self) -> tuple[list[float], list[float], list[float]]:
        f32, f16, again = (v["val_accuracy"] for v in self.communication["compression"]["variants"])
        return f32, f16, again

    def link(self, rate: str) -> dict[str, Any]:
        return next(p for p in self.communication["links"]["points"] if p["rate"] == rate)

    @cached_property
    def precision_runs(self) -> precision.Reference:
        found = precision.read(self.folder)
        if found is None:
            raise FigureError(f"no {precision.FILE} among the reference results")
        return found

    def speed(self, policy: str) -> float:
        return self.precision_runs.median(policy)

    @cached_property
    def profile(self) -> tuple[profile_reference.Reference, step_profile.Step]:
        found = profile_reference.read(self.folder)
        typical = found[1].typical() if found else None
        if found is None or typical is None:
            raise FigureError(f"no {profile_reference.FILE} with a profiled training step among the reference results")
        return found[0], typical

    @cached_property
    def large_batch(self) -> large_batch.Reference:
        found = large_batch.read(self.folder)
        if found is None:
            raise FigureError(f"no {large_batch.FILE} among the reference results")
        return found

    def updates(self, global_batch: int) -> int:
        point = next((p for p in self.large_batch.points if p.global_batch == global_batch), None)
        if point is None:
            raise FigureError(f"the large-batch reference has no run at a global batch of {global_batch}")
        return point.updates_per_epoch

    def final(self, rule: str, global_batch: int) -> int:
        point = drawn.at(self.large_batch.points, LB_RULES[rule], global_batch)
        if point is None or point.final is None:
            raise FigureError(f"the large-batch reference has no final accuracy for {rule} at {global_batch}")
        return round(100 * point.final)


def _speedup(m: Measured, name: str) -> float:
    return m.ips(name, 2) / m.ips(name, 1)


def _ttt(m: Measured, name: str, workers: int) -> float:
    t = m.point(name, workers).time_to_target_s
    if t is None:
        raise FigureError(f"the reference sweep {name!r} did not reach its target at {workers} worker(s)")
    return t


def _epochs_to_target(m: Measured, name: str, workers: int) -> int:
    epochs = reference.record(name, m.folder, workers=workers).epochs_to_target
    if epochs is None:
        raise FigureError(f"the reference sweep {name!r} did not reach its target at {workers} worker(s)")
    return epochs


def _step_s(m: Measured) -> float:
    return BATCH / m.ips("horovod-sweep", 1)


def _model(compute: float, gradient: float, workers: int, bandwidth: float) -> int:
    return round(100 * efficiency(compute, gradient, workers, bandwidth))


def _band(m: Measured) -> tuple[list[int], list[int], list[int]]:
    """The epochs (from 1) after which float16's accuracy was inside, above and below the float32 runs' band."""
    f32, f16, again = m.fp16_runs()
    inside, above, below = [], [], []
    for e, (a, h, b) in enumerate(zip(f32, f16, again, strict=True), 1):
        (inside if min(a, b) <= h <= max(a, b) else above if h > max(a, b) else below).append(e)
    return inside, above, below


def _epochs(numbers: list[int]) -> str:
    """``1 and 4``, ``3, 5 and 6``."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _ms(seconds: float) -> str:
    return f"{round(1000 * seconds)}"


FIGURES: dict[str, Callable[[Measured], str]] = {
    # lab 3: one and two logical devices on the same cores
    "lab3.one_device_ips": lambda m: f"{round(m.mirrored(1)):,}",
    "lab3.two_devices_ips": lambda m: f"{round(m.mirrored(2)):,}",
    "lab3.two_devices_gain": lambda m: f"{round(100 * (m.mirrored(2) / m.mirrored(1) - 1))}",
    # lab 6: the sweeps
    "lab6.one_worker_ips": lambda m: f"{round(m.ips('horovod-sweep', 1)):,}",
    "lab6.two_workers_ips": lambda m: f"{round(m.ips('horovod-sweep', 2)):,}",
    "lab6.step_ms": lambda m: _ms(_step_s(m)),
    "lab6.hvd_of_ceiling": lambda m: f"{round(100 * m.ips('horovod-sweep', 2) / (m.point('horovod-sweep', 2).ceiling_images_per_sec or float('nan')))}",  # noqa: E501
    "lab6.hvd_sooner": lambda m: f"{_ttt(m, 'horovod-sweep', 1) / _ttt(m, 'horovod-sweep', 2):.1f}",
    "lab6.tf_epochs_1": lambda m: str(_epochs_to_target(m, "tf-sweep", 1)),
    "lab6.tf_epochs_2": lambda m: str(_epochs_to_target(m, "tf-sweep", 2)),
    "lab6.both_cores_ips": lambda m: f"{round(m.mirrored(1), -1):,.0f}",
    "lab6.over_both_cores": lambda m: f"{m.ips('horovod-sweep', 2) / m.mirrored(1):.2f}",
    "lab6.over_both_cores_efficiency": lambda m: f"{round(50 * m.ips('horovod-sweep', 2) / m.mirrored(1))}",
    "lab6.model_loss_2": lambda m: f"{100 - _model(_step_s(m), SMALL_GRADIENT, 2, SHARED)}",
    "lab6.model_loss_8": lambda m: f"{100 - _model(_step_s(m), SMALL_GRADIENT, 8, SHARED)}",
    # lab 8: the knobs and links on virtual nodes, fp16 and accuracy
    "lab8.fusion_ratio": lambda m: f"{m.fusion()[1]['comm_s'] / m.fusion()[0]['comm_s']:.1f}",
    "lab8.unfused_comm_ms": lambda m: _ms(m.fusion()[1]["comm_s"]),
    "lab8.fused_comm_ms": lambda m: _ms(m.fusion()[0]["comm_s"]),
    "lab8.unfused_step_ms": lambda m: _ms(m.fusion()[1]["step_s"]),
    "lab8.fused_step_ms": lambda m: _ms(m.fusion()[0]["step_s"]),
    "lab8.fp16_comm_ratio": lambda m: f"{m.knob_compression()[1]['comm_s'] / m.knob_compression()[0]['comm_s']:.2f}",
    "lab8.fp16_step_ratio": lambda m: f"{m.knob_compression()[1]['step_s'] / m.knob_compression()[0]['step_s']:.2f}",
    "lab8.fp16_final": lambda m: f"{m.fp16_runs()[1][-1]:.2f}",
    "lab8.fp32_final": lambda m: f"{m.fp16_runs()[0][-1]:.2f}",
    "lab8.fp32_again_final": lambda m: f"{m.fp16_runs()[2][-1]:.2f}",
    "lab8.fp16_inside": lambda m: _epochs(_band(m)[0]),
    "lab8.fp16_above": lambda m: _epochs(_band(m)[1]),
    "lab8.fp16_below": lambda m: _epochs(_band(m)[2]),
    "lab8.fp32_spread_points": lambda m: f"{round(100 * max(abs(a - b) for a, b in zip(m.fp16_runs()[0], m.fp16_runs()[2], strict=True)))}",  # noqa: E501
    "lab8.unlimited_ips": lambda m: f"{round(m.link('unlimited')['images_per_sec'])}",
    "lab8.unlimited_model_ips": lambda m: f"{round(m.link('unlimited')['model_serial'])}",
    "lab8.alone_ips": lambda m: f"{round(m.communication['links']['alone_images_per_sec'])}",
    "lab8.alone_step_ms": lambda m: _ms(BATCH / m.communication["links"]["alone_images_per_sec"]),
    "lab8.serial_100mbit_ips": lambda m: f"{round(m.link('100mbit')['model_serial'])}",
    "lab8.overlap_100mbit_ips": lambda m: f"{round(m.link('100mbit')['model_overlap'])}",
    "lab8.ips_100mbit": lambda m: f"{round(m.link('100mbit')['images_per_sec'])}",
    "lab8.ips_1gbit": lambda m: f"{round(m.link('1gbit')['images_per_sec'])}",
    "lab9.bf16_ratio": lambda m: f"{m.precision_runs.ratio():.2f}",
    "lab9.bf16_ratio_range": lambda m: f"{min(m.precision_runs.ratios()):.2f} to {max(m.precision_runs.ratios()):.2f}",
    "lab9.reference_machine": lambda m: m.precision_runs.made.machine,
    "lab9.bf16_ips": lambda m: f"{round(m.speed('mixed_bfloat16'))}",
    "lab9.fp32_ips": lambda m: f"{round(m.speed('float32'))}",
    "lab9.profile_machine": lambda m: f"{m.profile[0].workers} workers on {m.profile[0].made.machine}",
    "lab9.profile_step_ms": lambda m: f"{1e3 * m.profile[1].wall:.0f}",
    "lab9.profile_allreduce_ms": lambda m: f"{1e3 * m.profile[1].allreduce:.0f}",
    **{f"lab9.profile_{part}": lambda m, p=part: f"{100 * m.profile[1].share(p):.0f}"
       for part in ("compute", "exposed", "input")},
}
# each sweep's speedup and efficiency at 2 workers, and its time to the target at 1 and 2 workers (s)
SWEEPS = {"hvd": "horovod-sweep", "tf": "tf-sweep"}
for _short, _sweep in SWEEPS.items():
    FIGURES[f"lab6.{_short}_speedup"] = lambda m, w=_sweep: f"{_speedup(m, w):.2f}"
    FIGURES[f"lab6.{_short}_efficiency"] = lambda m, w=_sweep: f"{round(50 * _speedup(m, w))}"
    for _n in (1, 2):
        FIGURES[f"lab6.{_short}_ttt_{_n}"] = lambda m, w=_sweep, n=_n: f"{round(_ttt(m, w, n))}"
# the scaling model's four cases (lab 6's cell): efficiency in % at 2, 4 and 8 workers
MODEL_CASES = {"eth": (0.05, FULL_GRADIENT, ETHERNET), "nvlink": (0.05, FULL_GRADIENT, NVLINK),
               "gpu_small": (0.002, SMALL_GRADIENT, ETHERNET)}
for _case, (_compute, _gradient, _bandwidth) in MODEL_CASES.items():
    for _n in (2, 4, 8):
        FIGURES[f"lab6.model_{_case}_{_n}"] = lambda m, c=_compute, g=_gradient, b=_bandwidth, n=_n: str(
            _model(c, g, n, b))
# the large-batch experiment (lab 9): each rule's final validation accuracy (%) at each global batch
for _rule in LB_RULES:
    for _g in LB_BATCHES:
        FIGURES[f"lab9.lb_{_rule}_{_g}"] = lambda m, r=_rule, g=_g: str(m.final(r, g))
FIGURES["lab9.lb_epochs"] = lambda m: str(m.large_batch.epochs)
FIGURES["lab9.lb_updates_2048"] = lambda m: str(m.updates(2048))
FIGURES["lab9.lb_machine"] = lambda m: f"{m.large_batch.workers} workers on {m.large_batch.made.machine}"
FIGURES["lab9.lb_minutes"] = lambda m: f"{sum(p.seconds or 0 for p in m.large_batch.points) / 60:.0f}"
# the learning-rate runs' validation accuracy (%) after the epochs the text quotes
LR_QUOTED = {"unscaled": (1, 6), "nowarmup": (1, 2, 3, 6), "warmup": (1, 2, 3, 4, 6)}
for _run, _epochs_quoted in LR_QUOTED.items():
    for _epoch in _epochs_quoted:
        FIGURES[f"lab6.lr_{_run}_{_epoch}"] = lambda m, r=_run, e=_epoch: str(m.lr_accuracy(r, e))


def figure(name: str, measured: Measured) -> str:
    """The figure called ``name``, from the reference results."""
    if name not in FIGURES:
        raise FigureError(f"no figure called {name!r} (labkit.measure.text_figures.FIGURES)")
    try:
        return FIGURES[name](measured)
    except (LookupError, KeyError, IndexError, ValueError, OSError) as e:
        raise FigureError(f"the figure {name!r} cannot be computed from the reference results: {e}") from e


def render(text: str, measured: Measured) -> str:
    """``text`` with every marked figure rewritten from the reference results."""
    return MARK.sub(lambda m: f"<!--fig:{m['name']}-->{figure(m['name'], measured)}<!--/fig-->", text)


def shown(text: str) -> str:
    """``text`` as a reader sees it: the markers gone, the figures left."""
    return MARK.sub(lambda m: m["value"], text)


def _render_file(path: Path, measured: Measured) -> str:
    text = path.read_text()
    if path.suffix != ".ipynb":
        return render(text, measured)
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        new = render(source, measured)
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def generate(root: Path = labs.ROOT, check: bool = False) -> list[str]:
    """Rewrite the marked figures of :data:`TEXTS` under the course ``root`` from its own reference results; the
    paths that changed (with ``check``: that would change, nothing written)."""
    measured = Measured(reference.folder(root))
    changed = []
    for rel in TEXTS:
        path = root / rel
        if not path.is_file():
            continue
        old, new = path.read_text(), _render_file(path, measured)
        if new != old:
            changed.append(rel)
            if not check:
                path.write_text(new)
    return changed
