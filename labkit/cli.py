"""The ``labkit`` command line."""

from __future__ import annotations

import argparse
import sys

from labkit import env

env.apply_defaults()


def _doctor(a: argparse.Namespace) -> int:
    from labkit import doctor

    return doctor.main(as_json=a.json)


def _data(a: argparse.Namespace) -> int:
    from labkit import data

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
    from labkit import sources

    changed = sources.generate(check=a.check)
    if a.check:
        if changed:
            print("out of date (run `make gen`): " + ", ".join(changed), file=sys.stderr)
            return 1
        print("starter and solution scripts are in sync with their templates")
        return 0
    print("wrote: " + (", ".join(changed) if changed else "nothing, all up to date"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit", description="Distributed deep learning lab kit")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="check that this machine is ready for the labs")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=_doctor)

    s = sub.add_parser("data", help="find and validate Fashion-MNIST offline")
    s.add_argument("--fill-cache", action="store_true", help="copy it into the Keras cache too")
    s.set_defaults(func=_data)

    g = sub.add_parser("gen", help="write starter and solution scripts from their templates")
    g.add_argument("--check", action="store_true", help="only report files that are out of date")
    g.set_defaults(func=_gen)

    for register in _extra():
        register(sub)
    return p


# Modules that add their own sub-commands (run, check, bench, ...).
def _extra() -> list:
    from labkit import assessment, bench_cli, check, cluster_cli, course, grade, k8s, launch, plot

    return [launch.add_cli, check.add_cli, grade.add_cli, course.add_cli, bench_cli.add_cli, plot.add_cli,
            cluster_cli.add_cli, k8s.add_cli, assessment.add_cli]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a clear line, not a traceback; --traceback shows it
        if args.traceback:
            raise
        problem = str(e) if isinstance(e, (ValueError, OSError, LookupError)) else f"{type(e).__name__}: {e}"
        print(f"labkit {args.command}: {problem}", file=sys.stderr)
        if not isinstance(e, (ValueError, OSError, LookupError)):
            print("(an unexpected error: run again with `labkit --traceback ...` to see where)", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, LookupError)) else 1


if __name__ == "__main__":
    sys.exit(main())
