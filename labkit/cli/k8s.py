"""``labkit k8s``: the command line of :mod:`labkit.deploy.k8s`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from labkit.core.cliargs import nonnegative_int, positive_int
from labkit.deploy.k8s import GPU, HOROVOD_SCRIPT, IMAGE, MWMS_SCRIPT, RUNTIME, render
from labkit.deploy.k8s_validate import ManifestError as ManifestError
from labkit.deploy.k8s_validate import validate as validate


def add_cli(sub) -> None:
    """Register ``labkit k8s {mpijob,trainjob,runtime}``."""
    p = sub.add_parser("k8s", help="write Kubernetes (Kubeflow) manifests for the lab's scripts",
                       description="Print or write a validated Kubeflow manifest. "
                       "Example: labkit k8s mpijob --workers 4 -o horovod.yaml -- fashion_mnist_solution.py --epochs 5")
    kinds = p.add_subparsers(dest="k8s_kind", required=True, metavar="{mpijob,trainjob,runtime}")
    helps = {"mpijob": f"Horovod as a Kubeflow MPIJob (default script: {HOROVOD_SCRIPT})",
             "trainjob": f"MultiWorkerMirroredStrategy as a Kubeflow Trainer TrainJob (default script: {MWMS_SCRIPT})",
             "runtime": f"the ClusterTrainingRuntime a TrainJob runs on (default name: {RUNTIME})"}
    for kind, text in helps.items():
        k = kinds.add_parser(kind, help=text, description=text)
        k.add_argument("--name", help="metadata.name (an RFC 1035 label)")
        k.add_argument("--image", help=f"container image (default: the placeholder {IMAGE})")
        if kind != "runtime":
            k.add_argument("--namespace", help="metadata.namespace (default: kubectl's current namespace)")
            k.add_argument("--workers", type=positive_int, help="worker pods (default: 2)")
            if kind == "mpijob":
                k.add_argument("--slots-per-worker", type=positive_int, help="MPI ranks per worker pod (default: 1)")
            k.add_argument("--gpus-per-worker", type=nonnegative_int,
                help=f"{GPU} limit per worker (default: 0, CPU only)")
            k.add_argument("--cpu", help="CPU request per worker (default: 2)")
            k.add_argument("--memory", help="memory request per worker (default: 8Gi)")
            if kind == "trainjob":
                k.add_argument("--runtime", help=f"ClusterTrainingRuntime name (default: {RUNTIME})")
            k.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- SCRIPT ARGS",
                           help="the script in the image's solutions/ folder and its arguments")
        k.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of printing ('-': print)")
        k.set_defaults(func=_cli_k8s)


def _cli_k8s(a: argparse.Namespace) -> int:
    try:
        text = render(a)
    except ValueError as e:
        print(f"labkit k8s: {e}", file=sys.stderr)
        return 2
    if a.output and a.output != "-":  # "-": standard output, as with no -o
        Path(a.output).write_text(text)
        print(f"wrote {a.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
