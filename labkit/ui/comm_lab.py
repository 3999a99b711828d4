"""Lab 8's cells: the link, Horovod's knobs and a straggler, measured here and drawn.

    comm_lab.link()                  # all-reduce against the ring model on 2 virtual nodes, 200 Mbit/s links
    comm_lab.knob("fusion")          # 256 small tensors a step, fused and not
    comm_lab.knob("compression")     # float32 against float16 on the same link
    comm_lab.straggler()             # which rank makes the others wait (Horovod's timeline), on this machine
    comm_lab.elastic()               # Horovod Elastic: a node leaves the job and comes back
    comm_lab.links("fashion_mnist.py")        # your Horovod script at several link rates, against the model
    comm_lab.compression("fashion_mnist.py")  # your Horovod script's accuracy with float32 and float16 gradients

Each measuring cell brings 2 virtual nodes up (or uses the ones ``labkit nodes up`` started) and takes the ones it
started down again. Where virtual nodes cannot start (no root: Binder, a shared JupyterHub), or the learner's script is
still the starter, it says why and shows the course's reference results (:mod:`labkit.measure.comm_reference`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.figures import comm
from labkit.measure import allreduce, comm_reference, knobs, link_sweep, timeline_straggler
from labkit.measure import compression as fp16
from labkit.measure import elastic as elastic_job
from labkit.nodes import virtual as nodes
from labkit.ui import nodes_lab, notebook

RATE = "200mbit"


def _reference(why: str) -> dict[str, Any] | None:
    print(f"Not run: {why}")
    try:
        data = comm_reference.load()
    except LookupError as e:
        print(f"(and {e})")
        return None
    made = data.get("made", {})
    print(f"The course's reference results instead (made on {made.get('date', '?')} on {made.get('machine', '?')}):")
    return data


def _reference_quietly() -> dict[str, Any] | None:
    try:
        return comm_reference.load()
    except LookupError as e:
        print(e)
        return None


def link(sizes: tuple[int, ...] = comm_reference.SIZES, rate: str = RATE, via: str = "gloo",
         repeat: int | None = None) -> allreduce.AllreduceResult | None:
    """Time the all-reduce of each tensor size on 2 workers across the link, against the ring model."""
    problem = nodes_lab.why_not()
    if problem:
        data = _reference(problem)
        result = comm_reference.link_result(data) if data else None
    else:
        with nodes_lab.using(2, 1, rate) as cluster:
            result = allreduce.measure(sizes, hostfile=cluster.hostfile, via=via,
                                       repeat=repeat or (2 if notebook.quick() else 5))
    if result is None:
        return None
    print(result)
    title = f"{result.via}, {result.workers} workers, link {result.rate}"
    notebook.show(comm.link([allreduce.human_bytes(s.bytes) for s in result.sizes], [s.median for s in result.sizes],
                    [s.model for s in result.sizes], title))
    return result


def knob(name: str, rate: str = RATE, steps: int | None = None) -> knobs.KnobResult | None:
    """Every variant of one Horovod knob (``fusion``, ``cycle``, ``compression``) on the same 2 workers."""
    problem = nodes_lab.why_not()
    if problem:
        data = _reference(problem)
        result = comm_reference.knob_result(data, name) if data and name in data.get("knobs", {}) else None
    else:
        with nodes_lab.using(2, 1, rate) as cluster:
            result = knobs.sweep(name, hostfile=cluster.hostfile, launcher="gloo",
                                 work=knobs.Workload(steps=steps or (6 if notebook.quick() else 12)))
    if result is None:
        return None
    print(result)
    notebook.show(comm.knob([v.label for v in result.variants], [v.comm_s for v in result.variants],
                    f"{name}: {result.tensors} tensors x {result.kib} KiB a step, link {result.rate or 'none'}"))
    return result


def straggler(share: float = 0.3, steps: int | None = None) -> timeline_straggler.Diagnosis:
    """Rank 1 gets ``share`` of the CPU time while it computes; the timeline says who waits for whom."""
    diagnosis = timeline_straggler.run(np=2, slow=1, share=share, steps=steps or (12 if notebook.quick() else 30))
    print(diagnosis)
    notebook.show(diagnosis.figure())
    return diagnosis


def elastic(epochs: int | None = None) -> elastic_job.ElasticReport | None:
    """The elastic job on 2 virtual nodes: node2 leaves after 3 epochs and comes back 4 epochs later."""
    problem = nodes_lab.why_not()
    if problem:
        data = _reference(problem)
        report = comm_reference.elastic_report(data) if data and "elastic" in data else None
    else:
        with nodes_lab.using(2, 1, RATE) as cluster:
            report = elastic_job.leave_and_return(cluster.hostfile, epochs=epochs or comm_reference.ELASTIC_EPOCHS,
                                                  leave_after=3, away=4)
    if report is None:
        return None
    print(report.summary)
    print("workers per epoch:", " ".join(str(s) for s in report.sizes()))
    lost = sorted(set(range(max(report.completed(), default=-1) + 1)) - report.completed())
    print("epochs lost:", ", ".join(map(str, lost)) if lost else "none (what a leaving worker began was redone)")
    notebook.show(comm.workers_per_epoch([e["epoch"] for e in report.epochs], report.sizes(), "Horovod Elastic: node2 "
                                 "leaves after 3 epochs, returns 4 later"))
    return report


def links(script: str, rates: tuple[str, ...] | None = None, epochs: int = 2) -> link_sweep.LinkSweep | None:
    """``script`` alone, then on 2 virtual nodes at each link rate, against the ring model's bounds."""
    finished = notebook.ready(script, "horovod", 8)
    problem = nodes_lab.why_not() if finished else None
    if finished and not problem and nodes.VirtualNodes.load() is not None:
        problem = ("virtual nodes are up (`labkit nodes up`), and this cell makes its own at each rate: "
                   "`labkit nodes down` first")
    if not finished or problem:
        data = _reference(problem) if problem else _reference_quietly()
        result = comm_reference.links_result(data) if data and "links" in data else None
    else:
        rates = rates or (("unlimited", "100mbit") if notebook.quick() else link_sweep.RATES)
        result = link_sweep.sweep(script, rates, notebook.args("--epochs", str(epochs)))
    if result is None:
        return None
    print(result)
    p = result.points
    notebook.show(comm.link_sweep([x.rate for x in p], [x.images_per_sec for x in p], [x.model_serial for x in p],
                          [x.model_overlap for x in p], f"{Path(result.script).name}, {result.np} nodes x 1 worker"))
    return result


def compression(script: str, epochs: int = 6) -> fp16.Comparison | None:
    """``script`` trained with float32 and with float16 gradients on 2 workers of this machine."""
    if not notebook.ready(script, "horovod", 8):
        data = _reference_quietly()
        result = comm_reference.compression_result(data) if data and "compression" in data else None
    else:
        result = fp16.compare(script, notebook.args("--epochs", str(epochs), fewest=2))
    if result is None:
        return None
    print(result)
    notebook.show(comm.accuracy_curves(result.curves(), f"{Path(result.script).name}: gradients sent as"))
    return result
