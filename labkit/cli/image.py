"""``labkit image build [--gpu] [--tag T]``: the course image, built with mmdebstrap and imported into podman."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from labkit.deploy.image import build, recipe


def add_cli(subparsers: Any) -> None:
    """Register ``labkit image build``."""
    p = subparsers.add_parser("image", help="build the course's container image (Debian, podman)",
                              description="The course image: a Debian root file system (mmdebstrap) with the "
                              "project's Python environment, Horovod, OpenMPI, ssh and Fashion-MNIST, imported "
                              "into podman. Needs root, mmdebstrap, podman and runc.")
    actions = p.add_subparsers(dest="image_action", required=True, metavar="{build}")
    b = actions.add_parser("build", help="build the image and import it into podman",
                           description=f"Build the course image and tag it (default {recipe.default_tag()}).")
    b.add_argument("--gpu", action="store_true", help="the CUDA variant (TensorFlow's CUDA wheels; unverified on "
                   "a GPU here), tagged -gpu")
    b.add_argument("--tag", help=f"the image's name (default {recipe.default_tag()}, or -gpu)")
    b.add_argument("--suite", help="Debian release of the image (default: this machine's)")
    b.add_argument("--oci-archive", type=Path, metavar="FILE", help="also write the image as an OCI archive")
    b.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    try:
        done = build.build(tag=a.tag, gpu=a.gpu, suite=a.suite, oci_archive=a.oci_archive,
                           say=lambda line: print(line, flush=True))
    except (build.BuildError, OSError, ValueError, LookupError) as e:
        print(f"labkit image: {e}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, LookupError)) and not isinstance(e, build.BuildError) else 1
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in done.steps.items())
    print(f"built {done.tag}: {done.size_bytes / 1e9:.2f} GB in {done.seconds:.0f} s ({steps})")
    conf = build.podman_env()["CONTAINERS_CONF"]
    print(f"try it: CONTAINERS_CONF={conf} podman --runtime {recipe.RUNC} run --rm --network none {done.tag} "
          "labkit doctor")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.cli.image build ...``, the same as ``labkit image build ...``."""
    parser = argparse.ArgumentParser(prog="labkit")
    add_cli(parser.add_subparsers(dest="subcommand", required=True))
    a = parser.parse_args(["image", *(sys.argv[1:] if argv is None else argv)])
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
