"""``labkit bench allreduce [--sizes 1M,8M,64M] [--hostfile F] [--np N] [--via mpi|gloo|mwms] [--repeat R] [--json]``.

``bench`` takes a SCRIPT; the word ``allreduce`` in its place measures the link instead
(:mod:`labkit.measure.allreduce`). :func:`add_to_bench` adds the options to ``bench``'s parser and routes
the call; ``--np``, ``--repeat``, ``--timeout``, ``--env``, ``--verbose`` and ``--json`` are ``bench``'s own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labkit.core.cliargs import route_word
from labkit.launching import launch
from labkit.measure import allreduce

WORD = "allreduce"
DEFAULT_REPEAT = 5


class _Default(int):
    """``bench``'s default ``--repeat`` (1), told apart from an explicit ``--repeat 1``."""


def add_to_bench(p: argparse.ArgumentParser) -> None:
    """Give ``bench``'s parser the ``allreduce`` options and route ``labkit bench allreduce`` to :func:`cli`."""
    g = p.add_argument_group(
        "bench allreduce", "labkit bench allreduce [--sizes 1M,8M,64M] [--hostfile F] [--np N] [--via mpi|gloo|mwms] "
        f"[--repeat R (default {DEFAULT_REPEAT})] [--json]: time all-reduce on the workers against the ring model")
    g.add_argument("--sizes", default="1M,8M,64M", help="tensor sizes in bytes, K/M/G = 2^10/2^20/2^30 "
                   "(default: %(default)s)")
    g.add_argument("--hostfile", dest="allreduce_hostfile", default=None, metavar="F",
                   help="OpenMPI hostfile of the workers (e.g. `labkit nodes status`'s); default: this machine")
    g.add_argument("--via", choices=allreduce.VIAS, default="mpi",
                   help="Horovod over MPI, Horovod over Gloo, or MultiWorkerMirroredStrategy (default: %(default)s)")
    g.add_argument("--rate", default=None, help="link rate for the model, e.g. 200mbit (default: the virtual nodes')")
    p.set_defaults(repeat=_Default(p.get_default("repeat") or 1))
    route_word(p, WORD, cli)


def cli(a: argparse.Namespace, np: int | None,
        run: Callable[..., allreduce.AllreduceResult] = allreduce.measure) -> int:
    repeat = DEFAULT_REPEAT if isinstance(a.repeat, _Default) else a.repeat
    try:
        sizes = allreduce.parse_sizes(a.sizes)
        result = run(sizes=sizes, np=np, hostfile=a.allreduce_hostfile, via=a.via, repeat=repeat, rate=a.rate,
                     job=allreduce.QUIET.but(timeout=a.timeout or 900, quiet=not a.verbose, env=dict(a.env) or None))
    except (ValueError, launch.LaunchError, RuntimeError) as e:
        print(f"labkit bench {WORD}: {e}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, launch.LaunchError)) else 1
    print(result.to_json() if a.json else str(result))
    return 0
