"""``labkit cloud vertex|azureml|sagemaker``: write (or check) the services' job specifications.

    labkit cloud vertex -o cloud/                          # the three solutions, checked, into cloud/
    labkit cloud sagemaker --solution horovod --nodes 4 --bucket my-bucket -- --epochs 5
    labkit cloud azureml --check cloud/azureml-ps.yml      # check a file a person edited
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from labkit.core.cliargs import nonnegative_int, positive_int
from labkit.deploy.cloud import PROVIDERS, SDKS
from labkit.deploy.cloud.jobs import SOLUTIONS, Plan, SpecError, header

EXTRA = "pip install 'labkit[cloud]'"


@dataclass
class Written:
    path: Path
    obj: dict[str, Any]
    sdk_object: Any  # None when the service's SDK is not installed


def sdk_installed(provider: str) -> bool:
    """Whether the service's SDK can be imported (finding it imports its parent packages, not itself)."""
    try:
        return importlib.util.find_spec(SDKS[provider]) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def check(provider: str, obj: dict[str, Any], require_sdk: bool = False) -> Any:
    """Validate ``obj`` with the service's SDK (when installed) and its field checks; the SDK's object or None."""
    module = PROVIDERS[provider]
    if sdk_installed(provider):
        return module.validate(obj)
    if require_sdk:
        raise SpecError(module.NAME, [f"the SDK ({SDKS[provider]}) is not installed: {EXTRA}"])
    errors = module.fields(obj)
    if errors:
        raise SpecError(module.NAME, errors)
    return None


def write(provider: str, plan: Plan, folder: Path, command: list[str]) -> Written:
    """Write the job specification of ``plan`` for ``provider`` into ``folder``, after checking it."""
    module = PROVIDERS[provider]
    plan = plan.resolved()
    obj, text = module.render(plan, header(command, module.NAME, plan, []))
    sdk_object = check(provider, yaml.safe_load(text))  # what a person's tools read back from the file
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{provider}-{plan.solution}.{module.EXT}"
    path.write_text(text)
    return Written(path, obj, sdk_object)


def check_file(provider: str, path: Path) -> Any:
    return check(provider, yaml.safe_load(path.read_text()), require_sdk=False)


def add_cli(subparsers: Any) -> None:
    """Register ``labkit cloud {vertex,azureml,sagemaker}``."""
    p = subparsers.add_parser("cloud", help="write job specifications for Vertex AI, Azure ML and SageMaker",
                              description="Write the managed services' job specifications for the course's "
                              "distributed solutions, running the course image, each checked by the service's SDK.")
    services = p.add_subparsers(dest="cloud_provider", required=True, metavar="{" + ",".join(PROVIDERS) + "}")
    for name, module in PROVIDERS.items():
        s = services.add_parser(name, help=module.NAME, description=(module.__doc__ or "").split("\n\n")[0])
        s.add_argument("--solution", choices=[*SOLUTIONS, "all"], default="all",
                       help="which solution (default: all three, one file each)")
        s.add_argument("--nodes", type=positive_int, default=2,
                       help="machines running the script (ps: the chief and the workers; default 2)")
        s.add_argument("--procs-per-node", type=positive_int, default=None,
                       help="Horovod ranks per machine (default: its GPUs, or 1)")
        s.add_argument("--ps", type=nonnegative_int, default=1, help="parameter servers for ps (default 1)")
        s.add_argument("--gpus", type=nonnegative_int, default=1, help="GPUs per machine (default 1; 0: CPU)")
        s.add_argument("--machine", default="", help="the service's machine or instance type (default: per GPUs)")
        s.add_argument("--bucket", default="", help="where checkpoints, backups and logs go")
        s.add_argument("--image", default="", help="the course image in a registry the service pulls from "
                       "(default: what `labkit image build` tags)")
        s.add_argument("--name", default="", help="the job's name (default labkit-SOLUTION)")
        s.add_argument("-o", "--output", default="cloud", metavar="DIR", help="folder to write into (default cloud/)")
        s.add_argument("--check", metavar="FILE", type=Path, help="only check FILE (a written or edited spec)")
        s.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                       help="the script's arguments, e.g. -- --epochs 5")
        s.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    provider = a.cloud_provider
    try:
        if a.check:
            if not a.check.is_file():
                raise OSError(f"no such file: {a.check}")
            done = check_file(provider, a.check)
            how = "its SDK and the fields the service reads" if done is not None else \
                f"the fields the service reads (SDK not installed: {EXTRA})"
            print(f"{a.check}: valid ({how})")
            return 0
        args = list(a.script_args or [])
        args = args[1:] if args[:1] == ["--"] else args
        solutions = list(SOLUTIONS) if a.solution == "all" else [a.solution]
        for solution in solutions:
            per = a.procs_per_node or (max(1, a.gpus) if SOLUTIONS[solution].launch == "mpi" else 1)
            plan = Plan(solution=solution, nodes=a.nodes, procs_per_node=per, ps=a.ps, gpus=a.gpus,
                        machine=a.machine, bucket=a.bucket, image=a.image, name=a.name, args=tuple(args))
            command = ["labkit", "cloud", provider, "--solution", solution, *_given(a),
                       *(["--", *args] if args else [])]
            w = write(provider, plan, Path(a.output), command)
            how = "checked by its SDK" if w.sdk_object is not None else f"fields checked; SDK not installed ({EXTRA})"
            print(f"wrote {w.path} ({how})")
    except (SpecError, OSError, yaml.YAMLError) as e:
        print(f"labkit cloud {provider}: {e}", file=sys.stderr)
        return 2
    return 0


def _given(a: argparse.Namespace) -> list[str]:
    """The options given on the command line that differ from their defaults, as they were written."""
    defaults = {"nodes": 2, "ps": 1, "gpus": 1}
    words = []
    for key in ("nodes", "procs_per_node", "ps", "gpus", "machine", "bucket", "image", "name"):
        value = getattr(a, key)
        if value not in (None, "") and value != defaults.get(key):
            words += [f"--{key.replace('_', '-')}", str(value)]
    return words


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.cli.cloud PROVIDER ...``, the same as ``labkit cloud PROVIDER ...``."""
    parser = argparse.ArgumentParser(prog="labkit")
    add_cli(parser.add_subparsers(dest="subcommand", required=True))
    a = parser.parse_args(["cloud", *(sys.argv[1:] if argv is None else argv)])
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
