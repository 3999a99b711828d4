"""The ``labkit`` command line."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from labkit.cli import assess as assess_cli
from labkit.cli import bench as bench_cli
from labkit.cli import check as check_cli
from labkit.cli import classes as classes_cli
from labkit.cli import cloud as cloud_cli
from labkit.cli import cluster as cluster_cli
from labkit.cli import doctor
from labkit.cli import grade as grade_cli
from labkit.cli import image as image_cli
from labkit.cli import k8s as k8s_cli
from labkit.cli import lab as lab_cli
from labkit.cli import nodes as nodes_cli
from labkit.cli import plot as plot_cli
from labkit.cli import release as release_cli
from labkit.cli import run as run_cli
from labkit.cli import solution as solution_cli
from labkit.cli import workshop as workshop_cli
from labkit.core import env
from labkit.core.cliargs import Parser, UsageError, script_of, split_dashdash
from labkit.course import sources
from labkit.instrument import data
from labkit.launching import hosts, launch
from labkit.measure import reference, text_figures


def _doctor(a: argparse.Namespace) -> int:
    return doctor.main(as_json=a.json)


def _data(a: argparse.Namespace) -> int:
    try:
        where = data.locate()
    except data.DataError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"Fashion-MNIST: {where} (validated)")
    if a.fill_cache:
        cache = data.fill_keras_cache(where)
        print(f"Keras cache:   {cache}  (tf.keras.datasets.fashion_mnist.load_data() works offline)")
    return 0


def _gen(a: argparse.Namespace) -> int:
    try:
        root = Path(a.root).resolve() if a.root else sources.course_source()
        if not sources.is_course_source(root):
            raise FileNotFoundError(f"{a.root} is not a course source: it needs solutions/source/, labs/ and "
                                    "pyproject.toml")
        changed = sources.generate(check=a.check, root=root) + text_figures.generate(root, check=a.check)
    except (OSError, text_figures.FigureError, reference.Missing) as e:  # no course there, a result it lacks
        print(f"labkit gen: {e}", file=sys.stderr)
        return 1
    if a.check:
        if changed:
            print("out of date (run `make gen`): " + ", ".join(changed), file=sys.stderr)
            return 1
        print("starter and solution scripts are in sync with their templates; the texts' figures with the "
              "reference results")
        return 0
    print("wrote: " + (", ".join(changed) if changed else "nothing, all up to date"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="labkit", description="Distributed deep learning lab kit")
    sub = p.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)

    d = sub.add_parser("doctor", help="check that this machine is ready for the labs")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=_doctor)

    s = sub.add_parser("data", help="find and validate Fashion-MNIST offline")
    s.add_argument("--fill-cache", action="store_true", help="copy it into the Keras cache too")
    s.set_defaults(func=_data)

    g = sub.add_parser("gen", help="write starter and solution scripts from their templates, and the figures "
                                   "in the course's texts from the reference results")
    g.add_argument("--check", action="store_true", help="only report files that are out of date")
    g.add_argument("--root", metavar="DIR", help="the course source to work on (default: the checkout this labkit "
                                                 "runs from, else the current folder or one above it)")
    g.set_defaults(func=_gen)

    for register in _extra():
        register(sub)
    return p


# The modules of this package that add their own sub-commands (run, check, bench, ...), in --help's order.
COMMANDS = (run_cli, check_cli, solution_cli, lab_cli, grade_cli, release_cli, bench_cli, plot_cli, cluster_cli,
            k8s_cli, cloud_cli, image_cli, assess_cli, nodes_cli, workshop_cli, classes_cli)


def _extra() -> list:
    return [module.add_cli for module in COMMANDS]


# The commands that run a script share one grammar: SCRIPT and options in any order, the script's own
# arguments after "--". "args": those arguments go to the script (a.args); "command": also
# `-- COMMAND ARGS` without SCRIPT, a whole command (a.command); None: nothing goes after "--".
RUNS_A_SCRIPT = {"run": "command", "cluster": "command", "bench": "args", "assess": "args", "check": None}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line, its inputs checked (script found, hosts resolvable); nothing is started
    or written. Raises :class:`UsageError` (or argparse's ``SystemExit(2)``) for a wrong call."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((t for t in argv if not t.startswith("-")), None)
    head, tail = split_dashdash(argv) if name in RUNS_A_SCRIPT else (argv, None)
    parser = build_parser()
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    a, extra = parser.parse_known_args(head)
    if extra:
        hint = (f" (the script's own arguments go after --: labkit {a.subcommand} SCRIPT [options] -- "
                f"{' '.join(extra)})" if RUNS_A_SCRIPT.get(a.subcommand) else "")
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if a.subcommand in RUNS_A_SCRIPT:
        _script_and_args(a, RUNS_A_SCRIPT[a.subcommand], tail)
    return a


def _script_and_args(a: argparse.Namespace, kind: str | None, tail: list[str] | None) -> None:
    script = getattr(a, "script", None)
    if kind is None and tail:
        raise UsageError(f"nothing goes after --: the command chooses {script or 'the script'}'s arguments")
    a.args = list(tail or [])
    if kind == "command":
        if script:
            a.command = ["python", script, *a.args]
        elif a.args:
            a.command, a.args = a.args, []
            script = script_of(a.command)
            local = not (getattr(a, "hosts", None) or getattr(a, "hostfile", None))
            if script is None and local and not shutil.which(a.command[0]) and not Path(a.command[0]).exists():
                raise UsageError(f"{a.command[0]} not found")
        else:
            raise UsageError(f"give a SCRIPT (labkit {a.subcommand} train.py [options] -- ARGS) or a whole "
                             f"command after -- (labkit {a.subcommand} [options] -- python train.py ARGS)")
    if script and script not in getattr(a, "script_words", ()) and not Path(script).is_file():
        raise UsageError(f"{script} not found")
    if getattr(a, "hosts", None) or getattr(a, "hostfile", None):
        _check_hosts(a)


def _check_hosts(a: argparse.Namespace) -> None:
    """Hosts named by --hosts/--hostfile: well formed, enough slots, names that resolve."""
    if a.subcommand == "cluster":
        needed = a.workers + a.ps + int(a.chief)
    else:
        needed = a.np or (a.nodes or 1) * (a.tasks_per_node or 2)
    try:
        hosts.validate(launch.host_list(a.hosts, a.hostfile), needed)
    except (launch.LaunchError, hosts.HostError) as e:
        raise UsageError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    env.apply_defaults()  # what every lab process needs, before anything imports TensorFlow
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
    except UsageError as e:
        name = next((t for t in argv if not t.startswith("-")), "")
        print(f"labkit {name}: {e}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a clear line, not a traceback; --traceback shows it
        if args.traceback:
            raise
        problem = str(e) if isinstance(e, (ValueError, OSError, LookupError)) else f"{type(e).__name__}: {e}"
        print(f"labkit {args.subcommand}: {problem}", file=sys.stderr)
        if not isinstance(e, (ValueError, OSError, LookupError)):
            print("(an unexpected error: run again with `labkit --traceback ...` to see where)", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, LookupError)) else 1


if __name__ == "__main__":
    sys.exit(main())
