"""``labkit bench knobs --knob fusion|cycle|compression [--hostfile F] [--np N] [--steps S] [--json]``.

Like ``labkit bench allreduce``, the word ``knobs`` in place of SCRIPT measures Horovod's communication knobs
(:mod:`labkit.measure.knobs`) on the workers of ``--hostfile`` (default: 2 on this machine); ``--np``,
``--timeout``, ``--verbose``, ``--json``, ``--launcher``, ``--hostfile`` and ``--rate`` are shared with ``bench`` and
``bench allreduce``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labkit.core.cliargs import positive_int, route_word
from labkit.launching import launch
from labkit.measure import knobs

WORD = "knobs"


def add_to_bench(p: argparse.ArgumentParser) -> None:
    """Give ``bench``'s parser the ``knobs`` options and route ``labkit bench knobs`` to :func:`cli`."""
    g = p.add_argument_group("bench knobs", "labkit bench knobs --knob fusion|cycle|compression [--hostfile F] "
                             "[--np N] [--steps S] [--json]: each variant of one Horovod knob on the same workers")
    g.add_argument("--knob", choices=list(knobs.KNOBS), default=None, help="the knob to sweep (bench knobs only)")
    g.add_argument("--steps", type=positive_int, default=20, help="steps per variant (bench knobs; default: 20)")
    route_word(p, WORD, cli)


def cli(a: argparse.Namespace, np: int | None, run: Callable[..., knobs.KnobResult] = knobs.sweep) -> int:
    if a.knob is None:
        print(f"labkit bench {WORD}: give --knob (one of {', '.join(knobs.KNOBS)})", file=sys.stderr)
        return 2
    try:
        if a.launcher == "cluster":
            raise ValueError("the knobs are Horovod's: choose --launcher mpirun, horovodrun or gloo")
        result = run(a.knob, hostfile=a.allreduce_hostfile, np=np, work=knobs.Workload(steps=a.steps), rate=a.rate,
                     launcher=a.launcher, job=knobs.QUIET.but(timeout=a.timeout or 600, quiet=not a.verbose))
    except (ValueError, launch.LaunchError, RuntimeError) as e:
        print(f"labkit bench {WORD}: {e}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, launch.LaunchError)) else 1
    print(result.to_json() if a.json else str(result))
    return 0
