"""The communication lab's reference results: the link and Horovod's knobs measured on virtual nodes.

    python -m labkit.measure.comm_reference [--out labs/reference] [--rate 200mbit]

brings up 2 virtual nodes of 1 slot with links of ``--rate`` (root), measures the all-reduce against the ring
model, sweeps tensor fusion and fp16 compression and runs the elastic job (Horovod over Gloo); then runs the
course's Horovod solution at several link rates (:mod:`labkit.measure.link_sweep`) and with float32 and float16
gradients (:mod:`labkit.measure.compression`); and writes ``communication.json`` (``--only PART,...`` measures
some parts again and keeps the others). Lab 8 shows it where virtual nodes cannot start (no root: Binder, a shared
JupyterHub) or the learner's script is still the starter.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from labkit.core import files
from labkit.course import labs
from labkit.measure import allreduce, compression, elastic, knobs, link_sweep, reference
from labkit.nodes import net
from labkit.nodes import virtual as nodes

FILE = "communication.json"
SIZES = (2**20, 2**23)
KNOBS = ("fusion", "compression")
ELASTIC_EPOCHS = 14


PARTS = ("link", "knobs", "elastic", "links", "compression")


def make(out: Path, rate: str = "200mbit", repeat: int = 3, steps: int = 10,
         parts: tuple[str, ...] = PARTS, epochs: int = 3, compression_epochs: int = 6) -> Path:
    """Measure ``parts`` (on fresh virtual nodes; ``links`` and ``compression`` run the Horovod solution in small
    mode) and write ``out/communication.json``, keeping the parts it does not measure."""
    path = Path(out) / FILE
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    if {"link", "knobs", "elastic"} & set(parts):
        with nodes.VirtualNodes(count=2, slots=1, rate=rate) as cluster:
            if "link" in parts:
                data["link"] = json.loads(allreduce.measure(SIZES, hostfile=cluster.hostfile, via="gloo",
                                                            repeat=repeat).to_json())
            if "knobs" in parts:
                work = knobs.Workload(steps=steps)
                data["knobs"] = {k: asdict(knobs.sweep(k, hostfile=cluster.hostfile, work=work, launcher="gloo"))
                                 for k in KNOBS}
            if "elastic" in parts:
                grown = elastic.leave_and_return(cluster.hostfile, epochs=ELASTIC_EPOCHS)
                data["elastic"] = {"epochs": grown.epochs, "ok": grown.ok, "summary": without_folders(grown.summary)}
            data.get("link", {})["log_dir"] = ""  # a folder of the machine that made them, not the learner's
    solution = str(reference.final_solution(labs.get("horovod")).resolve())
    small = ["--mode", "small"]
    # the script by name only: a learner's copy of the course has no solutions folder to point to
    if "links" in parts:
        data["links"] = asdict(link_sweep.sweep(solution, link_sweep.RATES, [*small, "--epochs", str(epochs)]))
        data["links"]["script"] = Path(solution).name
    if "compression" in parts:
        data["compression"] = asdict(compression.compare(solution, [*small, "--epochs", str(compression_epochs)]))
        data["compression"]["script"] = Path(solution).name
    made = {"date": time.strftime("%Y-%m-%d"), "machine": reference.machine(),
            "command": f"python -m labkit.measure.comm_reference --rate {rate} --only {','.join(parts)}"}
    data["made"] = made
    data.setdefault("parts_made", {}).update(dict.fromkeys(parts, made["date"]))
    files.write_json_atomic(path, data)
    return path


def without_folders(summary: str) -> str:
    """A run's summary without the folder of its logs: that folder is on the machine that made the reference
    results, never on the learner's."""
    return re.sub(r";? *logs in \S+", "", summary).rstrip()


def load() -> dict[str, Any]:
    """The reference results next to the notebook; :class:`LookupError` when there are none."""
    path = reference.folder() / FILE
    if not path.is_file():
        raise LookupError(f"no communication reference results in {path}")
    return json.loads(path.read_text())


def link_result(data: dict[str, Any]) -> allreduce.AllreduceResult:
    """The stored all-reduce measurement, as :func:`labkit.measure.allreduce.measure` returned it."""
    link = data["link"]
    bits = net.rate_bits(link["rate"]) if link.get("rate") else None
    out = allreduce.AllreduceResult(link["via"], link["workers"], link.get("rate"), hosts=link.get("hosts", []))
    out.sizes = [allreduce.SizeResult(s["bytes"], s["workers"], s["seconds"], bits) for s in link["sizes"]]
    return out


def knob_result(data: dict[str, Any], knob: str) -> knobs.KnobResult:
    """One stored knob sweep, as :func:`labkit.measure.knobs.sweep` returned it."""
    k = dict(data["knobs"][knob])
    variants = [knobs.Variant(**v) for v in k.pop("variants")]
    return knobs.KnobResult(**k, variants=variants)


def links_result(data: dict[str, Any]) -> link_sweep.LinkSweep:
    """The stored link sweep of the Horovod solution, as :func:`labkit.measure.link_sweep.sweep` returned it."""
    d = dict(data["links"])
    points = [link_sweep.LinkPoint(**p) for p in d.pop("points")]
    return link_sweep.LinkSweep(**d, points=points)


def compression_result(data: dict[str, Any]) -> compression.Comparison:
    """The stored float32/float16 comparison, as :func:`labkit.measure.compression.compare` returned it."""
    d = dict(data["compression"])
    variants = [compression.Variant(**v) for v in d.pop("variants")]
    return compression.Comparison(**d, variants=variants)


def elastic_report(data: dict[str, Any]) -> elastic.ElasticReport:
    """The stored elastic run, as :func:`labkit.measure.elastic.leave_and_return` returned it."""
    e = data["elastic"]
    return elastic.ElasticReport(e["epochs"], e["ok"], without_folders(e["summary"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.measure.comm_reference", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="labs/reference", help="folder to write communication.json to")
    p.add_argument("--rate", default="200mbit", help="the links' rate (default: %(default)s)")
    p.add_argument("--only", default=",".join(PARTS), help="the parts to measure again (default: all of %(default)s)")
    a = p.parse_args(argv)
    parts = tuple(x.strip() for x in a.only.split(",") if x.strip())
    if not parts or set(parts) - set(PARTS):
        print(f"comm_reference: --only takes some of {', '.join(PARTS)}", file=sys.stderr)
        return 2
    try:
        print(make(Path(a.out), a.rate, parts=parts))
    except (ValueError, RuntimeError) as e:  # NodesError is a RuntimeError
        print(f"comm_reference: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
