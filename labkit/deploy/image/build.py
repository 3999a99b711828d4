"""``labkit image build``: make the course image with mmdebstrap and import it into podman.

Steps, each a command from :mod:`labkit.deploy.image.recipe` run one at a time under ``nice``:
the wheels of the project's environment downloaded once into labkit's cache (``image/wheelhouse-<hash>``),
the repository's files and the cached Horovod wheel staged in a temporary folder, the root file
system made by ``mmdebstrap`` (``provision.sh`` runs inside it), ``podman import``. The temporary
folder and the root file system's tar are removed whatever happens.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import labkit
from labkit.core import contract, proc
from labkit.deploy.image import recipe

REPO = Path(labkit.__file__).resolve().parents[1]
HOROVOD_VERSION = "0.28.1"
NICE = ("nice", "-n", "10")
STEP_TIMEOUT = 3600.0  # seconds; a step still running then is stopped


class BuildError(RuntimeError):
    """The image could not be built; the message says why and what to do."""


@dataclass
class Built:
    tag: str
    seconds: float
    size_bytes: int
    steps: dict[str, float]


def cache_dir() -> Path:
    return Path(os.environ.get(contract.CACHE) or Path.home() / ".cache" / "labkit")


def missing_tools() -> list[str]:
    """What the build needs and this machine lacks (root, mmdebstrap, podman, runc)."""
    lacking = [] if os.geteuid() == 0 else ["root (mmdebstrap --mode=root and podman import)"]
    lacking += [t for t in ("mmdebstrap", "podman") if shutil.which(t) is None]
    return lacking + ([] if os.access(recipe.RUNC, os.X_OK) else [f"runc ({recipe.RUNC})"])


def horovod_wheel(cache: Path, gpu: bool = False) -> Path:
    """The Horovod wheel ``scripts/setup.sh`` built with the project's patch, for this environment."""
    patch = REPO / "patches" / f"horovod-{HOROVOD_VERSION}-tf2.21.patch"
    tf = md.version("tensorflow")
    key = (f"hvd{HOROVOD_VERSION}-tf{tf}-cp{sys.version_info[0]}{sys.version_info[1]}-gpu{int(gpu)}"
           f"-patch{hashlib.sha256(patch.read_bytes()).hexdigest()[:12]}")
    found = sorted((cache / "wheels" / key).glob("horovod-*.whl"))
    if not found:
        how = "LABKIT_HOROVOD_GPU=1 scripts/setup.sh on a GPU machine" if gpu else "scripts/setup.sh"
        raise BuildError(f"no cached Horovod wheel {cache / 'wheels' / key}: run {how} first")
    return found[-1]


def repo_files(root: Path = REPO) -> list[str]:
    """The repository's files as a clone has them (tracked and new, not ignored)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"the image holds the repository: run from a clone of it ({root} is not: {e})") from None
    return [f for f in out.split("\0") if f and (root / f).is_file()]


def stage_repo(dest: Path, root: Path = REPO) -> int:
    """Copy the repository's files to ``dest``; return how many."""
    files = repo_files(root)
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dest / f)
    return len(files)


def _run(argv: Sequence[str], log: Path, say: Callable[[str], None], env: dict[str, str] | None = None) -> float:
    say("$ " + " ".join(argv))
    start = time.monotonic()
    with proc.Job() as job:
        p = job.spawn([*NICE, *argv], env=env, log=log)
        code = p.wait(timeout=STEP_TIMEOUT)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
        why = "timed out" if code is None else f"exited with {code}"
        raise BuildError(f"{argv[0]} {why} (log: {log}):\n{tail}")
    return time.monotonic() - start


def wheelhouse(cache: Path, gpu: bool, logs: Path, say: Callable[[str], None]) -> tuple[Path, float]:
    """The wheels of the environment's requirements, downloaded once per set of versions."""
    image_python = subprocess.run(recipe.debian_python(), capture_output=True, text=True, check=True).stdout.strip()
    lines = recipe.requirements(gpu=gpu, python=image_python)
    for line in lines:
        if "<" in line:
            say(f"{line}: the installed release needs a newer Python than the image's {image_python}")
    house = cache / "image" / f"wheelhouse-{recipe.requirements_key(lines)}"
    done = house / ".complete"
    seconds = 0.0
    if not done.exists():
        house.mkdir(parents=True, exist_ok=True)
        (house / "requirements.txt").write_text("\n".join(lines) + "\n")
        say(f"downloading {len(lines)} packages' wheels into {house}")
        download = recipe.pip_download(sys.executable, house / "requirements.txt", house, image_python)
        seconds = _run(download, logs / "pip.log", say)
        done.touch()
    try:
        wheel = horovod_wheel(cache, gpu)
    except BuildError:
        if not gpu:
            raise
        wheel = horovod_wheel(cache, False)
        say(f"no GPU Horovod wheel cached: using {wheel.name} built without NCCL (allreduce over MPI in host memory)")
    for old in house.glob("horovod-*.whl"):
        old.unlink()
    shutil.copy2(wheel, house / wheel.name)
    return house, seconds


def podman_env(folder: Path | None = None) -> dict[str, str]:
    """The environment podman runs the image with: ``CONTAINERS_CONF`` naming labkit's containers.conf."""
    folder = folder or cache_dir() / "image"
    folder.mkdir(parents=True, exist_ok=True)
    return {"CONTAINERS_CONF": str(recipe.write_containers_conf(folder))}


def image_size(tag: str, env: dict[str, str]) -> int:
    out = subprocess.run([*recipe.podman(), "image", "inspect", "--format", "{{.Size}}", tag],
                         capture_output=True, text=True, env={**os.environ, **env}, check=True).stdout
    return int(out.strip() or 0)


def build(tag: str | None = None, gpu: bool = False, suite: str | None = None, oci_archive: Path | None = None,
          say: Callable[[str], None] = print) -> Built:
    """Build the image and import it into podman as ``tag`` (default :func:`recipe.default_tag`)."""
    lacking = missing_tools()
    if lacking:
        raise BuildError("needs " + ", ".join(lacking) + " (apt-get install mmdebstrap podman runc; run as root)")
    tag = tag or recipe.default_tag(gpu)
    cache = cache_dir()
    start = time.monotonic()
    steps: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="labkit-image-") as tmp:
        work = Path(tmp)
        logs = work / "logs"
        logs.mkdir()
        try:
            house, steps["download wheels"] = wheelhouse(cache, gpu, logs, say)
            context = work / "context"
            (context / "repo").mkdir(parents=True)
            say(f"staged {stage_repo(context / 'repo')} repository files")
            (context / "wheelhouse").symlink_to(house)
            rootfs = work / "rootfs.tar"
            steps["mmdebstrap"] = _run(recipe.mmdebstrap(context, rootfs, suite or recipe.host_suite(),
                                                         recipe.host_sources()), logs / "mmdebstrap.log", say)
            env = podman_env(cache / "image")
            steps["podman import"] = _run(recipe.podman_import(rootfs, tag, gpu), logs / "import.log", say, env)
            rootfs.unlink()
            if oci_archive:
                steps["oci archive"] = _run(recipe.podman_save(tag, oci_archive), logs / "save.log", say, env)
            size = image_size(tag, env)
        except BuildError:
            kept = cache / "image" / "last-build-logs"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(logs, kept)
            say(f"logs kept in {kept}")
            raise
    return Built(tag, time.monotonic() - start, size, steps)
