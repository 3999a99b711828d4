"""``labkit bench SCRIPT [options] -- ARGS``: the command line of :mod:`labkit.measure.bench`."""

from __future__ import annotations

import argparse
import sys

from labkit.cli import allreduce as allreduce_cli
from labkit.cli import knobs as knobs_cli
from labkit.core.cliargs import accuracy, add_script, positive_float, positive_int
from labkit.figures import plot
from labkit.instrument import optimizer_knobs
from labkit.launching.jobspec import JobSpec
from labkit.launching.launch import LaunchError
from labkit.launching.table import names
from labkit.measure import link_sweep
from labkit.measure.bench import SweepPlan, bench


def parse_nps(text: str) -> list[int]:
    """``"1,2,4"`` or ``"1-4"`` to a list of worker counts."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"bad worker counts {text!r}: use e.g. 1,2,4")
    return out


def parse_shrink(text: str) -> list[int]:
    """``"6000,1000,10"`` to ``[6000, 1000, 10]``."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 3 or min(values) < 0 or values[2] < 1:
        raise argparse.ArgumentTypeError(f"bad --shrink {text!r}: use TRAIN,TEST,DIVISOR, e.g. 6000,1000,10")
    return values


def parse_env(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``--env``."""
    name, sep, value = text.partition("=")
    if not sep or not name or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"bad --env {text!r}: use NAME=VALUE, e.g. HOROVOD_CYCLE_TIME=5")
    return name, value


DEFAULT_NPS = [1, 2]  # the same object when --np is not given


def parse_optimizer(text: str) -> str:
    """``--optimizer``: checked, kept as given (the workers read it)."""
    try:
        optimizer_knobs.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def parse_rates(text: str) -> list[str]:
    """``--rates``: link rates for :func:`labkit.measure.link_sweep.sweep`."""
    try:
        return link_sweep.parse_rates(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--np", type=parse_nps, default=DEFAULT_NPS, help="worker counts, e.g. 1,2,4 (default: 1,2)")
    p.add_argument("--repeat", type=positive_int, default=1,
        help="runs per worker count; the median is kept (default: 1)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="threads per worker (default: cores // workers); 1 gives equal cores per worker")
    p.add_argument("--launcher", choices=(*names(), "cluster"), default="mpirun",
                   help="mpirun/horovodrun/gloo for Horovod scripts, cluster for tf.distribute ones (TF_CONFIG); "
                        "default: mpirun")
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds per run before it is killed")
    p.add_argument("--runs-file", default=None, help="records file (default: $LABKIT_RUNS_FILE or runs/runs.jsonl)")
    p.add_argument("--json", action="store_true", default=False, help="print one JSON object instead of the table")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also save throughput/speedup plots here")
    p.add_argument("--verbose", action="store_true", default=False, help="stream rank 0's output")
    p.add_argument("--ceiling", action="store_true", default=False,
                   help="also run N independent single-worker copies at once: the machine's ceiling for N workers")
    p.add_argument("--shrink", type=parse_shrink, default=None, metavar="TRAIN,TEST,DIVISOR",
                   help="train on the first TRAIN/TEST images with Conv2D filters divided by DIVISOR, "
                        "without editing the script (e.g. 6000,1000,10 for the full WRN-16-10 on a CPU)")
    p.add_argument("--target", type=accuracy, default=None,
                   help="validation accuracy for the time to accuracy (default: the script's --target-accuracy)")
    p.add_argument("--optimizer", type=parse_optimizer, default=None, metavar="KNOB=VALUE,...",
                   help="Horovod optimizer knobs without editing the script: compression=none|fp16, "
                        "backward_passes_per_step=K")
    p.add_argument("--rates", type=parse_rates, default=None, metavar="R1,R2",
                   help="run on fresh virtual nodes (root), one worker per node, at each link rate "
                        "(e.g. unlimited,1gbit,100mbit), against the ring-allreduce model")
    p.add_argument("--env", type=parse_env, action="append", default=[], metavar="NAME=VALUE",
                   help="a variable for every worker, e.g. HOROVOD_CYCLE_TIME=5 to try a setting (repeatable)")


def add_cli(sub) -> None:
    """Register ``labkit bench SCRIPT [options] -- ARGS``."""
    p = sub.add_parser(
        "bench", help="measure throughput, speedup and efficiency at several worker counts",
        description="Run SCRIPT at each worker count, record every run, print speedup and efficiency.",
        epilog="examples:\n  labkit bench labs/fashion_mnist.py --np 1,2 --threads 1 -- --epochs 3\n"
               "  labkit bench --np 2 --launcher cluster labs/fashion_mnist_multiworker.py -- --epochs 2\n"
               "  labkit bench labs/fashion_mnist.py --np 2 --rates unlimited,100mbit -- --epochs 2",
    )
    _options(p)
    add_script(p, what="any Keras training script")  # the grammar of every command that runs a script: labkit.cli.main
    p.set_defaults(func=_cli)
    allreduce_cli.add_to_bench(p)  # `labkit bench allreduce`: the link instead of a script
    knobs_cli.add_to_bench(p)  # `labkit bench knobs`: Horovod's communication knobs


def _links(a) -> int:
    given = a.np is not DEFAULT_NPS
    if (given and len(a.np) != 1) or a.ceiling or a.shrink or a.env or a.optimizer or a.repeat != 1:
        print("labkit bench: --rates takes one --np and none of --ceiling, --shrink, --env, --optimizer, --repeat",
              file=sys.stderr)
        return 2
    np = a.np[0] if given else 2
    try:
        result = link_sweep.sweep(a.script, a.rates, a.args, np=np, launcher=a.launcher, runs_file=a.runs_file,
                                  say=lambda text: print(text, file=sys.stderr, flush=True),
                                  job=JobSpec(timeout=a.timeout or 1800, quiet=not a.verbose))
    except (LaunchError, ValueError, RuntimeError) as e:
        print(f"labkit bench: {e}", file=sys.stderr)
        return 2 if isinstance(e, (LaunchError, ValueError)) else 1
    print(result.to_json() if a.json else str(result))
    return 0 if all(p.images_per_sec for p in result.points) else 1


def _cli(a) -> int:
    if a.rates:
        return _links(a)
    try:
        plan = SweepPlan(a.np, a.repeat, a.args, a.launcher, runs_file=a.runs_file, ceiling=a.ceiling, shrink=a.shrink,
                         optimizer=a.optimizer,
                         hostfile=a.allreduce_hostfile)  # the workers' hosts (the ceiling's copies run here)
        job = JobSpec(timeout=a.timeout, threads=a.threads, env=dict(a.env), quiet=not a.verbose, target=a.target)
        sweep = bench(a.script, plan, job)
    except (LaunchError, ValueError) as e:
        print(f"labkit bench: {e}", file=sys.stderr)
        return 2
    if a.plot:
        out = plot.save(plot.scaling(sweep), a.plot)
        print(f"labkit bench: plot saved to {out}", file=sys.stderr)
    print(sweep.to_json() if a.json else str(sweep))
    return 0 if all(p.ok for p in sweep.points) else 1
