"""make setup on Linux without root: a minimal Debian (python3, python3-venv, g++, make; no cmake, MPI, patch or
git), a learner account without sudo, the repository as ``git archive`` gives it, then as that learner
``make setup && make test-fast``, ``labkit check horovod`` on the final Horovod solution and ``labkit check
multiworker`` on the final multi-worker solution, with the data set handed in through ``LABKIT_DATA``.

The container reaches only the package index, with this machine's certificate bundle and pip settings lent to it
(read-only mounts); that stays here, in the test, never in the product. Every container and image the test makes
is removed on exit, error or interrupt, and the test asserts it.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from helpers import paths
from helpers.podman import Store

from labkit.deploy.image import build, recipe
from labkit.instrument import data

ROOT = paths.ROOT
PACKAGES = ("python3", "python3-venv", "g++", "make")
LEARNER = "learner"
HOROVOD_SOLUTION = "solutions/fashion_mnist_after_step_08.py"
MULTIWORKER_SOLUTION = "solutions/fashion_mnist_multiworker_after_step_05.py"
# What lets pip in the container reach the index on this test machine (see the module's docstring).
LENT = ["-v", "/etc/ssl/certs:/etc/ssl/certs:ro", "-v", "/etc/pip.conf:/etc/pip.conf:ro", "-v", "/opt:/opt:ro",
        "-e", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"]

SCRIPT = f"""set -eu
cd "$HOME" && mkdir course && tar xf /in/repo.tar -C course && cd course
echo "setup-start $(date +%s)"
make setup
echo "setup-end $(date +%s)"
make test-fast
cp {HOROVOD_SOLUTION} labs/fashion_mnist.py
cp {MULTIWORKER_SOLUTION} labs/fashion_mnist_multiworker.py
.venv/bin/labkit check horovod labs/fashion_mnist.py
echo "check-horovod-passed"
.venv/bin/labkit check multiworker labs/fashion_mnist_multiworker.py
echo "check-multiworker-passed"
"""


def rootless_script() -> str:
    return SCRIPT


def test_the_script_runs_setup_then_the_fast_tests_and_both_checks() -> None:
    lines = rootless_script().splitlines()
    assert lines.index("make setup") < lines.index("make test-fast")
    assert (ROOT / HOROVOD_SOLUTION).exists() and (ROOT / MULTIWORKER_SOLUTION).exists()
    assert "sudo" not in rootless_script() and "LABKIT_TEST_TOOLS" not in rootless_script()


@pytest.mark.slow
@pytest.mark.heavy  # a minimal Debian, the whole install from the package index and a Horovod build: make test-heavy
def test_make_setup_without_root_then_the_fast_tests_and_the_checks(tmp_path: Path) -> None:
    lacking = build.missing_tools()
    if lacking:
        pytest.skip("needs " + ", ".join(lacking))
    if not Path("/etc/pip.conf").exists():
        pytest.skip("the container reaches the package index only with this machine's pip settings")
    found = data.find()
    if found is None:
        pytest.skip("Fashion-MNIST is not on this machine (LABKIT_DATA)")
    inbox = tmp_path / "in"
    inbox.mkdir()
    shutil.copytree(found, inbox / "data")
    with (inbox / "repo.tar").open("wb") as out:
        subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, stdout=out, check=True, timeout=120)
    (inbox / "run.sh").write_text(rootless_script())
    tag = f"localhost/labkit-rootless-test:{uuid.uuid4().hex[:8]}"
    name = f"labkit-test-rootless-{uuid.uuid4().hex[:8]}"
    rootfs = tmp_path / "rootfs.tar"
    store = Store(Path(tempfile.mkdtemp(prefix="labkit-rootless-podman-")))

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        subprocess.run(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
                        f"--customize-hook=chroot \"$1\" useradd -m -s /bin/bash {LEARNER}",
                        recipe.host_suite(), str(rootfs), str(recipe.host_sources())],
                       check=True, capture_output=True, timeout=900)
        store.run("import", str(rootfs), tag)
        rootfs.unlink()
        run = store.run("run", "--name", name, "--user", LEARNER, "-w", f"/home/{LEARNER}", *LENT,
                      "-v", f"{inbox}:/in:ro", "-e", "LABKIT_DATA=/in/data", tag,
                      "bash", "/in/run.sh", timeout=5400, check=False)
        log = run.stdout + run.stderr
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        (ROOT / "test-artifacts" / "rootless-setup.log").write_text(log)
        start = re.search(r"setup-start (\d+)", log)
        end = re.search(r"setup-end (\d+)", log)
        if start and end:
            print(f"make setup without root in the container: {int(end.group(1)) - int(start.group(1))} s")
        assert run.returncode == 0, log[-5000:]
        assert "check-horovod-passed" in log and "check-multiworker-passed" in log
        assert "from the package index into .venv" in log and "Installed without root" in log
    finally:
        signal.signal(signal.SIGTERM, previous)
        kept = store.logs(name)
        if kept:  # what the container said, also when the run was cut short
            (ROOT / "test-artifacts").mkdir(exist_ok=True)
            (ROOT / "test-artifacts" / "rootless-setup.container.log").write_text(kept)
        store.empty()
        assert store.left() == [], f"the test left its podman store or its mounts: {store.left()}"
