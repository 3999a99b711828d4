"""The communication lab's reference results: the link and Horovod's knobs measured on virtual nodes.

    python -m labkit.measure.comm_reference [--out labs/reference] [--rate 200mbit]

brings up 2 virtual nodes of 1 slot with links of ``--rate`` (root), measures the all-reduce against the ring
model, sweeps tensor fusion and fp16 compression and runs the elastic job (Horovod over Gloo), and writes
``communication.json``. Lab 8
shows it where virtual nodes cannot start (no root: Binder, a shared JupyterHub).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from labkit.core import files
from labkit.measure import allreduce, elastic, knobs, reference
from labkit.nodes import net
from labkit.nodes import virtual as nodes

FILE = "communication.json"
SIZES = (2**20, 2**23)
KNOBS = ("fusion", "compression")
ELASTIC_EPOCHS = 14


def make(out: Path, rate: str = "200mbit", repeat: int = 3, steps: int = 10) -> Path:
    """Measure on fresh virtual nodes and write ``out/communication.json``."""
    with nodes.VirtualNodes(count=2, slots=1, rate=rate) as cluster:
        link = allreduce.measure(SIZES, hostfile=cluster.hostfile, via="gloo", repeat=repeat)
        swept = {k: asdict(knobs.sweep(k, hostfile=cluster.hostfile, steps=steps, launcher="gloo")) for k in KNOBS}
        grown = elastic.leave_and_return(cluster.hostfile, epochs=ELASTIC_EPOCHS)
    data = {"made": {"date": time.strftime("%Y-%m-%d"), "machine": reference.machine(),
                     "command": f"python -m labkit.measure.comm_reference --rate {rate}"},
            "link": json.loads(link.to_json()), "knobs": swept,
            "elastic": {"epochs": grown.epochs, "ok": grown.ok, "summary": grown.summary}}
    path = Path(out) / FILE
    files.write_json_atomic(path, data)
    return path


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


def elastic_report(data: dict[str, Any]) -> elastic.ElasticReport:
    """The stored elastic run, as :func:`labkit.measure.elastic.leave_and_return` returned it."""
    e = data["elastic"]
    return elastic.ElasticReport(e["epochs"], e["ok"], e["summary"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.measure.comm_reference", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="labs/reference", help="folder to write communication.json to")
    p.add_argument("--rate", default="200mbit", help="the links' rate (default: %(default)s)")
    a = p.parse_args(argv)
    try:
        print(make(Path(a.out), a.rate))
    except (ValueError, RuntimeError) as e:  # NodesError is a RuntimeError
        print(f"comm_reference: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
