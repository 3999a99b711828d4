"""The link made visible: time all-reduce on the workers and compare it with the ring model.

    labkit bench allreduce --hostfile /run/labkit-nodes/hostfile --np 2 --sizes 1M,8M,64M --via mpi
    result = labkit.measure.allreduce.measure(sizes=[2**20, 2**23], np=2, hostfile=..., via="gloo")
    print(result)

The measuring program is :mod:`labkit.instrument.allreduce_worker`, a plain script that runs with python on the
workers (Horovod over MPI, Horovod over Gloo, or MultiWorkerMirroredStrategy's all-reduce in a
``TF_CONFIG`` cluster). Per size it reports the median of the timed repeats.

*Bus bandwidth* is what each link carried per second: a ring all-reduce of ``B`` bytes over ``N``
workers sends ``2 (N-1)/N * B`` bytes out of every worker (reduce-scatter, then all-gather), so
``busbw = 2 (N-1)/N * B / t``. The ring model's time at a link rate of ``R`` bits/s (each way) is
``2 (N-1)/N * B * 8 / R``: bandwidth only, no latency (virtual nodes add none).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.instrument import allreduce_worker
from labkit.launching import hosts, launch
from labkit.launching.jobspec import JobSpec
from labkit.nodes import net as nodes_net
from labkit.nodes import virtual as nodes
from labkit.tfdist import cluster
from labkit.tfdist.cluster import Tasks

VIAS = ("mpi", "gloo", "mwms")
LAUNCHER = {"mpi": "mpirun", "gloo": "gloo"}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMG]?)B?$", re.IGNORECASE)
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_sizes(text: str) -> list[int]:
    """``"1M,8M,64M"`` to bytes (K, M, G are powers of 1024); ValueError for anything else."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        m = _SIZE.match(part)
        if not m:
            raise ValueError(f"bad size {part!r} in {text!r}: write bytes like 4096, 512K, 8M or 1G")
        nbytes = int(float(m.group(1)) * _UNIT[m.group(2).upper()])
        if nbytes < 4:
            raise ValueError(f"size {part!r} is smaller than one float32 (4 bytes)")
        out.append(nbytes // 4 * 4)
    return out


def bus_factor(workers: int) -> float:
    """Bytes each worker sends per byte reduced in a ring all-reduce: 2 (N-1)/N."""
    if workers < 1:
        raise ValueError(f"need at least one worker, got {workers}")
    return 2 * (workers - 1) / workers


def bus_bandwidth(nbytes: int, seconds: float, workers: int) -> float:
    """Bytes per second each link carried (``2 (N-1)/N * bytes / seconds``)."""
    return bus_factor(workers) * nbytes / seconds


def ring_seconds(nbytes: int, workers: int, rate_bits: float) -> float:
    """The ring model: seconds to all-reduce ``nbytes`` over links of ``rate_bits`` bits/s each way."""
    return bus_factor(workers) * nbytes * 8 / rate_bits


def human_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


@dataclass
class SizeResult:
    """One tensor size: its timed repeats and what they mean."""

    bytes: int
    workers: int
    seconds: list[float]
    rate_bits: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def busbw(self) -> float:
        """Achieved bus bandwidth, bytes/s (0 for one worker: nothing crosses a link)."""
        return bus_bandwidth(self.bytes, self.median, self.workers)

    @property
    def model(self) -> float | None:
        return ring_seconds(self.bytes, self.workers, self.rate_bits) if self.rate_bits else None

    @property
    def ratio(self) -> float | None:
        """Measured over model: 1.0 is the link's full rate, 1.25 is 25% slower than the link allows."""
        return self.median / self.model if self.model else None

    def to_dict(self) -> dict:
        return {**asdict(self), "median_s": self.median, "busbw_bytes_per_s": self.busbw, "model_s": self.model,
                "ratio": self.ratio}


@dataclass
class AllreduceResult:
    """All sizes of one measurement, with its conditions."""

    via: str
    workers: int
    rate: str | None
    sizes: list[SizeResult] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    log_dir: str = ""

    def to_json(self) -> str:
        return json.dumps({"via": self.via, "workers": self.workers, "rate": self.rate, "hosts": self.hosts,
                           "log_dir": self.log_dir, "sizes": [s.to_dict() for s in self.sizes]}, indent=1)

    def __str__(self) -> str:
        return format_table(self)


def format_table(result: AllreduceResult) -> str:
    """The table ``labkit bench allreduce`` prints."""
    rate = f"link {result.rate} each way" if result.rate else "link rate unknown (give --rate): no model"
    where = ", ".join(result.hosts) if result.hosts else "this machine"
    lines = [f"all-reduce of float32 tensors, {result.via}, {result.workers} workers on {where}; {rate}",
             f"{'bytes':>10}  {'size':>9}  {'median s':>9}  {'bus bandwidth':>14}  {'model s':>8}  {'ratio':>6}  "
             "repeats"]
    for s in result.sizes:
        model = f"{s.model:8.4f}" if s.model else f"{'-':>8}"
        ratio = f"{s.ratio:6.2f}" if s.ratio else f"{'-':>6}"
        bw = f"{s.busbw * 8 / 1e6:9.1f} Mbit/s"
        lines.append(f"{s.bytes:>10}  {human_bytes(s.bytes):>9}  {s.median:9.4f}  {bw:>14}  {model}  {ratio}  "
                     f"{len(s.seconds)}")
    lines.append("bus bandwidth = 2(N-1)/N x bytes / median; model = 2(N-1)/N x bytes x 8 / rate (ring, no latency); "
                 "ratio = median / model")
    return "\n".join(lines)


def parse_output(text: str) -> list[dict]:
    """The worker's result lines (``ALLREDUCE {...}``) in a log."""
    mark = allreduce_worker.MARK
    return [json.loads(line[line.index(mark) + len(mark):]) for line in text.splitlines() if mark in line]


def link_rate(rate: str | None = None) -> str | None:
    """``rate`` when given (checked), else the running virtual nodes' link rate, else None."""
    if rate:
        nodes_net.rate_bits(rate)
        return rate
    running = nodes.VirtualNodes.load()
    return running.rate if running else None


def worker_command(sizes: Sequence[int], repeat: int, warmup: int, via: str) -> list[str]:
    return ["python", str(Path(allreduce_worker.__file__).resolve()), "--sizes", ",".join(map(str, sizes)),
            "--repeat", str(repeat), "--warmup", str(warmup), "--via", "mwms" if via == "mwms" else "horovod"]


QUIET = JobSpec(timeout=900, quiet=True)  # the measuring job: at most 15 minutes, no output of its own


def measure(sizes: Sequence[int] = (2**20, 2**23, 2**26), np: int | None = None, hostfile: str | Path | None = None,
            via: str = "mpi", repeat: int = 5, warmup: int = 2, rate: str | None = None,
            job: JobSpec = QUIET) -> AllreduceResult:
    """Run the measuring program on ``np`` workers (default: every slot of ``hostfile``, else 2) as a job given
    ``job`` (its timeout, output, log folder, environment added), and return the medians; ``rate`` (default: the
    virtual nodes') gives the model. RuntimeError if the job fails."""
    if via not in VIAS:
        raise ValueError(f"unknown --via {via!r}: choose one of {', '.join(VIAS)}")
    if repeat < 1 or warmup < 0:
        raise ValueError("repeat must be >= 1 and warmup >= 0")
    host_list = hosts.parse_hostfile(hostfile) if hostfile else []
    np = np or (sum(hosts.slots(h) for h in host_list) if host_list else 2)
    rate = link_rate(rate)
    command = worker_command(sizes, repeat, warmup, via)
    if via == "mwms":
        res = cluster.run(command, tasks=Tasks(workers=np, host_list=host_list or None),
                          job=job.but(record=False, threads=1))
        ok, logs, text = res.ok, res.log_dir, res.log("worker.0")
        why = res.summary()
    else:
        run = launch.run(command, job=job.but(record=False, threads=1), np=np, launcher=LAUNCHER[via],
                         hostfile=hostfile)
        ok, logs, text, why = run.ok, run.log_dir, run.log(0), run.summary()
    found = parse_output(text)
    if not ok or len(found) != len(sizes):
        raise RuntimeError(f"the all-reduce measurement failed ({via}, {np} workers):\n{why}")
    bits = nodes_net.rate_bits(rate) if rate else None
    out = AllreduceResult(via, np, rate, hosts=[h.name for h in host_list], log_dir=str(logs))
    out.sizes = [SizeResult(r["bytes"], r["workers"], r["seconds"], bits) for r in found]
    return out
