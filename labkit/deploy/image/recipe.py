"""What goes into the course image and the commands that make and run it, as argument lists.

Nothing here runs anything: :mod:`labkit.deploy.image.build` runs these lists, and the tests read them.
The image is a Debian root file system (``mmdebstrap --variant=minbase`` from the mirror this machine's
apt uses) with the Debian packages below, then ``provision.sh`` inside it installs the project's Python
environment from a folder of wheels downloaded from the package index (the versions of the environment
running labkit), the cached Horovod wheel (built with the project's patch) and labkit itself at
``/opt/labkit``. podman runs it with ``runc`` (``crun`` fails on hybrid cgroups) and with a
``containers.conf`` that sets no default ulimits (a container cannot raise ``nofile`` above the limit
its parent has).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import labkit

IMAGE_NAME = "localhost/labkit"
USER = "labkit"
ROOT = "/opt/labkit"  # the repository inside the image; its environment is ROOT/.venv
WORK = "/home/labkit/work"  # the learner's folder (mount one here to keep it): the course is written in at first start
PORT = 8888
# What the image runs by default: JupyterLab on the learner's course, reachable from the host (-p 8888:8888).
SERVE = ["labkit", "lab", "--dir", WORK, "--ip", "0.0.0.0", "--port", str(PORT)]
STAGE = "/tmp/labkit-build"  # where the build context is copied inside the root file system
RUNC = "/usr/sbin/runc"
PROVISION = Path(__file__).with_name("provision.sh")
# Its path in the repository (the same inside the image, under ROOT): follows the package wherever it moves.
PROVISION_PATH = PROVISION.relative_to(Path(labkit.__file__).resolve().parents[1]).as_posix()
# Debian packages of the image (the Containerfile lists the same: a test compares them).
# iproute2: labs 7 and 8's virtual nodes, in a container run as root with the capabilities they need (docs/cloud.md)
PACKAGES = ("python3", "python3-venv", "openmpi-bin", "openssh-server", "openssh-client", "iproute2",
            "ca-certificates", "procps", "dataset-fashion-mnist")
# tensorflow[and-cuda]: the CUDA libraries as wheels; the host needs only the NVIDIA driver.
GPU_EXTRA = "and-cuda"
# Horovod and what Horovod imports (setup.sh installs the same next to the wheel).
HOROVOD_DEPS = ("cloudpickle", "psutil", "pyyaml", "packaging", "cffi")
BUILD_TOOLS = ("setuptools>=68", "wheel")  # to install labkit itself (pyproject's build backend)
SKIP = ("pip", "setuptools", "wheel")  # the image's own build tools, not pinned: BUILD_TOOLS
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"


def default_tag(gpu: bool = False) -> str:
    """What ``labkit image build`` tags: ``localhost/labkit:<version>`` (``-gpu`` for the CUDA variant)."""
    return f"{IMAGE_NAME}:{labkit.__version__}{'-gpu' if gpu else ''}"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(roots: Sequence[str] = ("labkit", "horovod"), extra_roots: Sequence[str] = HOROVOD_DEPS,
                 gpu: bool = False, python: str | None = None) -> list[str]:
    """``name==version`` for everything ``roots`` need, as installed in the running environment.

    The closure of the roots' requirements (markers evaluated here, no extras of the roots), so that
    packages installed next to labkit for other purposes (test tools, the cloud SDKs) stay out of the
    image. The roots themselves are left out: labkit is copied, Horovod comes from its wheel. With
    ``python`` (the image's Python version), a release that needs a newer Python than the image's
    becomes ``name<version``: pip takes the newest release that fits.
    """
    installed = {_norm(d.metadata["Name"]): d for d in md.distributions()}
    # (name, extras, optional): optional when reached through an extra (the CUDA wheels: not installed here)
    todo: list[tuple[str, frozenset[str], bool]] = [(r, frozenset(), False) for r in roots]
    todo += [(_norm(r), frozenset(), False) for r in extra_roots]
    if gpu:
        todo.append(("tensorflow", frozenset({GPU_EXTRA}), False))
    seen: set[tuple[str, frozenset[str]]] = set()
    pins: dict[str, str] = {}
    while todo:
        name, extras, optional = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = installed.get(_norm(name))
        if dist is None:
            if optional:
                continue  # pip resolves it from the pinned parent's extra
            raise LookupError(f"{name} is required but not installed in {sys.prefix}")
        if _norm(name) not in [*map(_norm, roots), *SKIP]:
            needs = dist.metadata.get("Requires-Python")
            fits = python is None or not needs or SpecifierSet(needs).contains(python, prereleases=True)
            pins[_norm(name)] = f"{dist.metadata['Name']}{'==' if fits else '<'}{dist.version}"
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in envs):
                via_extra = optional or (req.marker is not None and "extra" in str(req.marker))
                todo.append((_norm(req.name), frozenset(req.extras), via_extra))
    if gpu:  # the CUDA wheels are not installed here: pin tensorflow with its extra, pip resolves them
        tf = pins.get("tensorflow", "tensorflow")
        pins["tensorflow"] = tf.replace("tensorflow==", f"tensorflow[{GPU_EXTRA}]==", 1)
    return sorted(pins.values(), key=str.lower)


def requirements_key(lines: Sequence[str]) -> str:
    """A short hash naming a wheelhouse downloaded for these requirements."""
    return hashlib.sha256("\n".join([*lines, *BUILD_TOOLS]).encode()).hexdigest()[:12]


def pip_download(python: str, requirements_file: Path, dest: Path, image_python: str) -> list[str]:
    """Download the wheels of the requirements for the image's Python (binary only: nothing is compiled
    inside the image)."""
    return [python, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--python-version", image_python,
            "--dest", str(dest), "-r", str(requirements_file), *BUILD_TOOLS]


def debian_python(python3: str = "/usr/bin/python3") -> list[str]:
    """The command that prints the Python version of this machine's Debian (the image's, same suite)."""
    return [python3, "-c", "import platform; print(platform.python_version())"]


def host_sources() -> Path:
    """The apt sources this machine uses (its Debian mirror), handed to mmdebstrap as they are."""
    for p in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if p.is_file() and p.read_text().strip():
            return p
    raise FileNotFoundError("no apt sources found (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list)")


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """This machine's Debian release name (the image uses the same: the same Python and OpenMPI)."""
    found = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", os_release.read_text(), re.M)
    if not found:
        raise ValueError(f"no VERSION_CODENAME in {os_release}: give the suite")
    return found.group(1)


def mmdebstrap(context: Path, output: Path, suite: str, sources: Path,
               packages: Sequence[str] = PACKAGES) -> list[str]:
    """Make the root file system as a tar: minbase, the packages, then ``provision.sh`` inside it."""
    return ["mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar", "--include=" + ",".join(packages),
            "--aptopt=Acquire::Retries \"3\"",
            f"--customize-hook=mkdir -p \"$1{STAGE}\" \"$1{ROOT}\"",
            f"--customize-hook=sync-in {context / 'repo'} {ROOT}",
            f"--customize-hook=sync-in {context / 'wheelhouse'} {STAGE}",
            f"--customize-hook=chroot \"$1\" sh {ROOT}/{PROVISION_PATH} {STAGE}",
            f"--customize-hook=rm -rf \"$1{STAGE}\"",
            suite, str(output), str(sources)]


def image_config(gpu: bool = False) -> list[str]:
    """The image's settings (``podman import --change``): user, folder, PATH, what it runs (JupyterLab on the
    course in :data:`WORK`; ``labkit doctor`` or any command given after the image name instead)."""
    path = f"{ROOT}/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = [f"PATH={path}", "TF_USE_LEGACY_KERAS=1", "OMPI_MCA_btl_vader_single_copy_mechanism=none"]
    env += [] if gpu else ["CUDA_VISIBLE_DEVICES="]
    changes = [f"USER {USER}", f"WORKDIR {ROOT}", f"CMD {json.dumps(SERVE)}", f"EXPOSE {PORT}",
               *[f"ENV {e}" for e in env],
               f"LABEL org.opencontainers.image.version={labkit.__version__}",
               "LABEL org.opencontainers.image.title=labkit"]
    return [w for c in changes for w in ("--change", c)]


def podman() -> list[str]:
    """``podman`` with runc; the caller sets ``CONTAINERS_CONF`` to :func:`write_containers_conf`'s file."""
    return ["podman", "--runtime", RUNC]


def podman_import(tar: Path, tag: str, gpu: bool = False) -> list[str]:
    return [*podman(), "import", *image_config(gpu), str(tar), tag]


def podman_run(tag: str, command: Sequence[str], name: str | None = None, network: str = "none",
               user: str | None = None, hostname: str | None = None, detach: bool = False,
               gpus: bool = False) -> list[str]:
    """Run ``command`` in a new container of ``tag``, removed when it ends."""
    opts = ["--rm", f"--network={network}"]
    opts += [f"--name={name}"] if name else []
    opts += [f"--hostname={hostname}"] if hostname else []
    opts += [f"--user={user}"] if user else []
    opts += ["--detach"] if detach else []
    opts += ["--device", "nvidia.com/gpu=all"] if gpus else []  # CDI, from the NVIDIA container toolkit
    return [*podman(), "run", *opts, tag, *command]


def podman_save(tag: str, archive: Path) -> list[str]:
    """Write the image as an OCI archive (for ``skopeo copy oci-archive:...`` or another machine)."""
    return [*podman(), "save", "--format", "oci-archive", "-o", str(archive), tag]


def write_containers_conf(folder: Path) -> Path:
    """A containers.conf without default ulimits; give it to podman as ``CONTAINERS_CONF``."""
    path = folder / "containers.conf"
    path.write_text(CONTAINERS_CONF)
    return path
