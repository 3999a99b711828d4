"""Binder: binder/ (apt.txt, runtime.txt, postBuild, start) as repo2docker runs it.

repo2docker builds an image: the Python that ``binder/runtime.txt`` names, the packages of ``binder/apt.txt``
installed as root, the repository copied into the home of the user ``jovyan`` (uid 1000) and owned by it, then as
that user ``binder/postBuild`` from the repository's root with the environment's Python first on PATH; the image's
command (JupyterLab) runs through ``binder/start``.

Two tests, both in ``make test-heavy``:

* in a container (needs root, mmdebstrap and podman): those steps as a podman build of a Debian root file system,
  then ``jupyter lab`` through ``binder/start`` in the container, ``labkit doctor`` in it, and
  ``labs/01_baseline.ipynb`` run top to bottom through that JupyterLab in chromium. Binder's base image is Ubuntu
  and its environment is conda's; here Debian with a venv of Debian's Python, of the version runtime.txt names
  (the test fails if they differ). pip in the container reaches the package index only with this machine's
  certificate bundle and pip settings, lent to the postBuild step as read-only mounts: never part of binder/.
  Every image, container and folder the test makes is removed, and the test asserts it.
* on this machine, without a container: postBuild from a clean clone into a fresh venv (apt.txt's packages are the
  machine's own), then ``labkit doctor`` through ``binder/start``; it runs where podman cannot.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers import notebooks, paths
from helpers.podman import Store

ROOT = paths.ROOT
BINDER = ROOT / "binder"


def _runtime_python() -> str:
    """The interpreter binder/runtime.txt asks for (``python-3.11`` -> ``python3.11``)."""
    version = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    found = shutil.which(f"python{version}")
    if found is None:
        pytest.skip(f"binder/runtime.txt asks for Python {version}, which this machine lacks")
    return found


def test_runtime_and_apt_files_match_what_setup_needs() -> None:
    version = (BINDER / "runtime.txt").read_text().strip()
    assert version.startswith("python-3.") and 10 <= int(version.split(".")[1]) <= 13  # TensorFlow 2.21's range
    apt = set((BINDER / "apt.txt").read_text().split())
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert {"openmpi-bin", "libopenmpi-dev", "dataset-fashion-mnist"} <= apt
    assert all(pkg in setup for pkg in apt), "apt.txt names a package the setup does not know"
    assert os.access(BINDER / "postBuild", os.X_OK) and os.access(BINDER / "start", os.X_OK)


@pytest.mark.slow
@pytest.mark.heavy  # a fresh environment from PyPI's wheels: make test-heavy
@pytest.mark.horovod
def test_postbuild_installs_a_working_lab_into_a_fresh_environment(tmp_path: Path) -> None:
    repo, env_dir = tmp_path / "repo", tmp_path / "env"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True, timeout=120)
    subprocess.run([_runtime_python(), "-m", "venv", str(env_dir)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_", "VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["PIP_NO_COMPILE"] = "1"  # no byte-compiling of TensorFlow's thousands of files: a minute less, same install
    post_build = subprocess.run(["bash", str(repo / "binder" / "postBuild")], cwd=repo, env=env, capture_output=True,
                           text=True, timeout=1500)
    assert post_build.returncode == 0, (post_build.stdout + post_build.stderr)[-3000:]
    python = env_dir / "bin" / "python"
    assert not (repo / ".venv").exists(), "postBuild must install into Binder's environment, not a .venv"
    doctor = subprocess.run([str(repo / "binder" / "start"), str(env_dir / "bin" / "labkit"), "doctor", "--json"],
                            cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(doctor.stdout)
    assert report["ready"] is True, doctor.stdout[-3000:]
    assert report["horovod"]["mpi"] is True and report["horovod"]["version"] == "0.28.1"
    where = subprocess.run([str(python), "-c", "import labkit, tensorflow as tf; print(labkit.__file__)"],
                           env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)  # not this checkout
    assert where.stdout.strip().startswith(str(repo)), where.stdout + where.stderr
    assert sys.prefix != str(env_dir)


# ---------------------------------------------------------------- Binder's own container
# repo2docker's image, step by step: a Debian root file system (mmdebstrap) with the user jovyan (uid 1000); as root,
# binder/apt.txt's packages and the Python environment (repo2docker's conda environment of the runtime.txt version
# under /srv/conda; here a venv of Debian's Python of the same version, under /srv/venv, owned by jovyan); the
# repository copied into jovyan's home, owned by jovyan; as jovyan, `./binder/postBuild` from the repository's root
# with the environment first on PATH; binder/start before the command that serves JupyterLab.
USER, UID, HOME, PREFIX = "jovyan", 1000, "/home/jovyan", "/srv/venv"
BASE_PACKAGES = ("python3", "python3-venv")  # repo2docker's base image brings its Python; apt.txt brings the rest
NOTEBOOK = "labs/01_baseline.ipynb"
# What lets pip in the container reach the index on this test machine (tests/integration/test_rootless_setup.py):
# lent to the postBuild step only, never part of the image or of binder/.
LENT = ["--volume", "/etc/ssl/certs:/etc/ssl/certs:ro", "--volume", "/etc/pip.conf:/etc/pip.conf:ro",
        "--volume", "/opt:/opt:ro", "--build-arg", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"]
# Binder's command; the last option only lets the test read JupyterLab's state in the page (tests/helpers/browser.py).
SERVE = ["jupyter", "lab", "--ip", "0.0.0.0", "--no-browser", "--LabApp.expose_app_in_browser=True"]
PATH = f"{PREFIX}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def apt_packages() -> list[str]:
    """binder/apt.txt as repo2docker reads it: one package a line, blank lines and ``#`` comments skipped."""
    lines = (line.split("#", 1)[0].strip() for line in (BINDER / "apt.txt").read_text().splitlines())
    return [line for line in lines if line]


def containerfiles(base: str, system: str) -> tuple[str, str]:
    """The two builds: what repo2docker does as root (``system``, from ``base``), then postBuild as jovyan."""
    root = f"""FROM {base}
ENV LANG=C.UTF-8 LC_ALL=C.UTF-8 SHELL=/bin/bash USER={USER} NB_USER={USER} NB_UID={UID} HOME={HOME} \\
    NB_PYTHON_PREFIX={PREFIX} DEBIAN_FRONTEND=noninteractive
USER root
RUN apt-get -qq update && apt-get -qq install --yes --no-install-recommends {" ".join(apt_packages())} \\
    && apt-get -qq purge && apt-get -qq clean && rm -rf /var/lib/apt/lists/*
RUN mkdir -p {PREFIX} && chown {USER}:{USER} {PREFIX}
COPY --chown={UID}:{UID} repo/ {HOME}/
USER {USER}
RUN python3 -m venv {PREFIX}
ENV PATH={PATH}
WORKDIR {HOME}
"""
    user = f"""FROM {system}
USER {USER}
WORKDIR {HOME}
ARG PIP_CERT
RUN chmod +x binder/postBuild
RUN ./binder/postBuild
RUN chmod +x binder/start
ENTRYPOINT ["{HOME}/binder/start"]
CMD ["jupyter", "lab", "--ip", "0.0.0.0", "--no-browser"]
"""
    return root, user


def test_the_containerfiles_follow_repo2docker() -> None:
    root, user = containerfiles("localhost/base:1", "localhost/system:1")
    assert "openmpi-bin" in root and root.index("USER root") < root.index("apt-get") < root.index(f"USER {USER}")
    assert f"COPY --chown={UID}:{UID} repo/ {HOME}/" in root and f"ENV PATH={PREFIX}/bin:" in root
    assert user.index(f"USER {USER}") < user.index("RUN ./binder/postBuild")
    assert "/etc/pip.conf" not in root + user and "/opt" not in root + user  # the lent mounts stay in podman's call
    assert apt_packages() == (BINDER / "apt.txt").read_text().split()


def _serve(store: Store, tag: str, name: str, token: str, timeout: float = 180) -> str:
    """The image's command as Binder starts it (binder/start wraps ``jupyter lab``), on a free port; its address."""
    from labkit.core import tfconfig

    port = tfconfig.free_ports(1)[0]
    store.run("run", "--detach", f"--name={name}", "-p", f"127.0.0.1:{port}:8888", "-e", f"JUPYTER_TOKEN={token}",
              tag, *SERVE, timeout=120)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5).read()
            return url
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"JupyterLab did not answer in {timeout:.0f} s:\n"
                                     f"{store.logs(name)[-3000:]}") from None
            time.sleep(1)


def _run_notebook(url: str, token: str, path: str, shot: Path, timeout: float = 900) -> list[str]:
    """Open ``path`` in JupyterLab in chromium, run every cell, and say what a learner would see as wrong."""
    from helpers import browser

    label = ("() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
             f"&& window.jupyterapp.shell.currentWidget.title.label === {json.dumps(Path(path).name)}")
    idle = ("() => { const p = window.jupyterapp.shell.currentWidget; return p.sessionContext "
            "&& p.sessionContext.session && p.sessionContext.session.kernel "
            "&& p.sessionContext.session.kernel.status === 'idle'; }")
    with browser.browser() as page:
        page.goto(f"{url}/lab/tree/{path}?token={token}", timeout=180_000)
        page.wait_for_function(label, timeout=180_000)
        page.wait_for_function(idle, timeout=180_000)
        state = browser.run_all(page, timeout)
        browser.screenshot(page, shot)
        found = browser.problems(state, images=1)
        text = notebooks.outputs_text(browser.to_notebook(state, ROOT / path))
        return found + [f"no {want!r} in the outputs" for want in ("Images/sec:", "test accuracy:") if want not in text]


@pytest.mark.slow
@pytest.mark.heavy  # a Debian root file system, apt.txt, a fresh install from the package index, a Horovod build
def test_binder_container_builds_serves_jupyterlab_and_runs_a_lab() -> None:
    from helpers import browser

    from labkit.deploy.image import build, recipe

    lacking = build.missing_tools()
    if lacking:
        pytest.skip("needs " + ", ".join(lacking))
    if not Path("/etc/pip.conf").exists():
        pytest.skip("the container reaches the package index only with this machine's pip settings")
    if browser.missing():
        pytest.skip(browser.missing())
    version = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    suite = recipe.host_suite()
    run_id = uuid.uuid4().hex[:8]
    tags = [f"localhost/labkit-binder-test-{part}:{run_id}" for part in ("base", "system", "user")]
    name = f"labkit-test-binder-{run_id}"
    token = uuid.uuid4().hex
    artifacts = ROOT / "test-artifacts" / "binder"
    artifacts.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="labkit-binder-"))
    store = Store(Path(tempfile.mkdtemp(prefix="labkit-binder-podman-")))  # beside the build's context, not in it
    times: dict[str, float] = {}

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def podman_build(containerfile: str, tag: str, *extra: str, timeout: float) -> None:
        (scratch / "Containerfile").write_text(containerfile)
        out = store.run("build", "--layers=false", "--pull=never", *extra, "-t", tag,
                        "-f", str(scratch / "Containerfile"), str(scratch), timeout=timeout, check=False)
        log = out.stdout + out.stderr
        (artifacts / f"build-{tag.split('-')[-1].split(':')[0]}.log").write_text(log)
        assert out.returncode == 0, log[-5000:]

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        start = time.monotonic()
        rootfs = scratch / "rootfs.tar"
        subprocess.run(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES),
                        f"--customize-hook=chroot \"$1\" useradd -m -u {UID} -s /bin/bash {USER}",
                        suite, str(rootfs), str(recipe.host_sources())],
                       check=True, capture_output=True, timeout=900)
        store.run("import", str(rootfs), tags[0])
        rootfs.unlink()
        got = store.run("run", "--rm", "--network=none", tags[0], "python3", "-c",
                      "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
        assert got == version, f"binder/runtime.txt says Python {version}; Debian {suite} has {got}"
        (scratch / "repo").mkdir()
        # The tracked files as they are now (what Binder builds once they are committed).
        tree = subprocess.run(["git", "stash", "create"], cwd=ROOT, capture_output=True, text=True, check=True,
                              timeout=120).stdout.strip() or "HEAD"
        archive = subprocess.run(["git", "archive", "--format=tar", tree], cwd=ROOT, capture_output=True,
                                 check=True, timeout=120).stdout
        subprocess.run(["tar", "xf", "-", "-C", str(scratch / "repo")], input=archive, check=True, timeout=120)
        root, user = containerfiles(tags[0], tags[1])
        podman_build(root, tags[1], timeout=1200)
        times["image"] = time.monotonic() - start
        print(f"Binder image (root file system, apt.txt, the environment): {times['image']:.0f} s")

        start = time.monotonic()
        podman_build(user, tags[2], *LENT, timeout=2400)
        times["postBuild"] = time.monotonic() - start
        print(f"postBuild as {USER}: {times['postBuild']:.0f} s")

        def in_container(*command: str) -> subprocess.CompletedProcess:
            return store.run("exec", "-w", "/tmp", name, f"{HOME}/binder/start", *command, timeout=300, check=False)

        start = time.monotonic()
        url = _serve(store, tags[2], name, token)
        times["serve"] = time.monotonic() - start
        print(f"JupyterLab through binder/start answered after {times['serve']:.0f} s")
        served = store.run("top", name, "user", "args", check=False).stdout
        assert "jupyter-lab" in served or "jupyter lab" in served, served
        assert all(line.split()[0] == USER for line in served.splitlines()[1:]), served  # not root

        doctor = in_container("labkit", "doctor", "--json")
        report = json.loads(doctor.stdout)
        assert report["ready"] is True, doctor.stdout[-3000:] + doctor.stderr[-2000:]
        assert report["horovod"]["mpi"] is True and report["horovod"]["version"] == "0.28.1"
        where = in_container("python", "-c", "import sys, labkit; print(sys.prefix, labkit.__file__)")
        assert where.stdout.split() == [PREFIX, f"{HOME}/labkit/__init__.py"], where.stdout + where.stderr
        no_venv = in_container("test", "-e", f"{HOME}/.venv")
        assert no_venv.returncode == 1, "postBuild must install into Binder's environment, not a .venv"

        start = time.monotonic()
        found = _run_notebook(url, token, NOTEBOOK, artifacts / "01_baseline.png")
        times["notebook"] = time.monotonic() - start
        print(f"{NOTEBOOK} run through that JupyterLab: {times['notebook']:.0f} s")
        assert found == [], "\n".join(found)
    finally:
        signal.signal(signal.SIGTERM, previous)
        kept = store.logs(name)
        if kept:
            (artifacts / "jupyterlab.log").write_text(kept)
        store.empty()
        shutil.rmtree(scratch, ignore_errors=True)
        (artifacts / "times.json").write_text(json.dumps(times, indent=1))
        assert store.left() == [] and not scratch.exists(), f"the test left {scratch}: {store.left()}"
