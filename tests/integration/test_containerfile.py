"""The Containerfile built as a learner builds it, then lab 2 run in JupyterLab served from the built image.

A Debian base image of this machine's suite (``mmdebstrap`` minbase, ``podman import`` as ``debian:SUITE-slim``,
what the Containerfile's ``FROM`` names), then ``podman build -f Containerfile`` on the repository as ``git
archive HEAD`` gives it (untracked files never enter), Horovod built inside. The built image runs as a learner
runs it, ``podman run -p 127.0.0.1:PORT:8888 -v WORK:/home/labkit/work IMAGE`` with no command, and a browser
opens the address with the token it printed and runs ``labs/02_horovod.ipynb`` top to bottom, asserting what the
notebook tests assert of lab 2 (``tests/browser/test_notebook_horovod.py``, ``test_browser.py``). The container
gets the browser tests' settings only: quick mode, lab settings without autosave or windowing, and the
application exposed to the page's scripts (``LabApp.expose_app_in_browser``), through environment variables.
Before that, ``labkit doctor`` and ``labkit nodes up`` run in the image as its user, as root, as root with
``--cap-add NET_ADMIN,SYS_ADMIN`` and privileged: each must end as docs/cloud.md says.

pip inside the build reaches the package index only with this machine's certificate bundle and pip settings lent
to it, read-only; that stays here, in the test, never in the Containerfile. The bundle is lent as a file of its
own (apt installs ca-certificates into the image's /etc/ssl/certs during the build, so that folder cannot be
covered) and the lent pip settings point at it.

Everything lives in a podman store of the test's own (``--root``/``--runroot`` in a temporary folder): the base,
the stages and the image, the container. It is emptied and removed on exit, error, timeout or interrupt, and the
test asserts that nothing is left: no container of its name, no mount, no folder.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from helpers import paths
from helpers.podman import HOST_CA, HOST_PIP, LENT_CA, Store, lab_settings, lent_pip, skip_unless_served

from labkit.core import contract, tfconfig
from labkit.deploy.image import build, recipe

ROOT = paths.ROOT
NB = "labs/02_horovod.ipynb"
BUILD_TIMEOUT = 5400.0
LAB_TIMEOUT = 1500.0
# What test_browser.py expects of lab 2: the ranks' weights at steps 3 and 4, one big vs two small; the progress.
EXPECT = {"images": 3, "widgets": 1}


def test_the_lent_pip_settings_name_the_lent_bundle(tmp_path: Path) -> None:
    opts = lent_pip(tmp_path, "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\nfind-links = /opt/wheels\n")
    assert (tmp_path / "pip.conf").read_text() == f"[global]\ncert = {LENT_CA}\nfind-links = /opt/wheels\n"
    assert f"{HOST_CA}:{LENT_CA}:ro" in opts and "/opt/wheels:/opt/wheels:ro" in opts
    assert not [o for o in opts if o.startswith("/opt:")]
    lent_pip(tmp_path, "")
    assert (tmp_path / "pip.conf").read_text() == f"[global]\ncert = {LENT_CA}\n"
    text = (ROOT / "Containerfile").read_text()
    assert "test suite builds it" in text and "not built by the test suite" not in text
    assert "/etc/pip.conf" not in text and "PIP_CERT" not in text and "labkit-test" not in text


def _serve(store: Store, image: str, name: str, work: Path, settings: list[str]) -> tuple[str, str]:
    """The image as a learner runs it (no command), on a free port of the loopback address; its URL and token."""
    port = tfconfig.free_ports(1)[0]
    store.run("run", "--rm", "--detach", f"--name={name}", "-p", f"127.0.0.1:{port}:{recipe.PORT}",
              "-v", f"{work}:{recipe.WORK}", *settings, "-e", f"{contract.NB_QUICK}=1", image, timeout=120)
    token = store.wait_for(name, r"token=(\w+)", 180)
    return f"http://127.0.0.1:{port}", token[1]


# What labs 7 and 8's virtual nodes need in a container, tried in the built image (docs/cloud.md reports it): as
# the image's user, as root, as root with the capabilities for namespaces, privileged. Each with what `labkit nodes
# up` exited with when it was measured (None: not a start of the nodes) and what the output says.
NODES_UP = "labkit nodes up --count 2 --slots 1; echo \"up exited $?\"; labkit nodes status; labkit nodes down"
NODES_TRIES = {
    "doctor (image user)": ([], "labkit doctor", None, "need root"),
    "nodes up (image user)": ([], NODES_UP, 1, "root"),
    "nodes up (root)": (["--user", "root"], NODES_UP, 1, "--cap-add NET_ADMIN,SYS_ADMIN"),
    "nodes up (root, --cap-add NET_ADMIN,SYS_ADMIN)":
        (["--user", "root", "--cap-add", "NET_ADMIN,SYS_ADMIN"], NODES_UP, 0, "up in "),
    "nodes up (root, --privileged)": (["--user", "root", "--privileged"], NODES_UP, 0, "up in "),
}


def _try_nodes(store: Store, image: str, out: Path) -> list[str]:
    """Run each of :data:`NODES_TRIES` in a container of its own; print how each ended, keep the whole output in
    ``out``; what ended otherwise than when it was measured."""
    lines, changed = [], []
    for what, (opts, command, expected, says) in NODES_TRIES.items():
        run = store.run("run", "--rm", *opts, image, "sh", "-c", command, timeout=600, check=False)
        text = run.stdout + run.stderr
        lines.append(f"=== {what}: podman {' '.join(opts)} ... sh -c {command!r} (exit {run.returncode})\n{text}")
        said = re.search(r"up exited (\d+)", text)
        print(f"{what}: exit {run.returncode}" + (f", nodes up exited {said[1]}" if said else "")
              + "; " + " | ".join(x for x in text.strip().splitlines()[-3:]), flush=True)
        if run.returncode != 0 or (expected is not None and (not said or int(said[1]) != expected)) \
                or says not in text:
            changed.append(f"{what}: exit {run.returncode}, {said[0] if said else 'nodes up did not run'}")
    out.write_text("\n".join(lines))
    return changed


@pytest.mark.slow
@pytest.mark.heavy  # a Debian base, the Containerfile built with Horovod from source, lab 2 in it: make test-heavy
def test_the_containerfile_builds_and_serves_lab_2(tmp_path: Path) -> None:

    from helpers import browser
    from helpers.notebooks import outputs_text

    skip_unless_served()
    suite = recipe.host_suite()
    folder = Path(tempfile.mkdtemp(prefix="labkit-containerfile-"))
    store = Store(folder)
    name = f"labkit-test-containerfile-{uuid.uuid4().hex[:8]}"
    image = f"localhost/labkit-containerfile-test:{uuid.uuid4().hex[:8]}"
    artifacts = ROOT / "test-artifacts" / "containerfile"
    artifacts.mkdir(parents=True, exist_ok=True)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        # The base the Containerfile's FROM names, in the test's store only.
        rootfs = folder / "base.tar"
        start = time.monotonic()
        subprocess.run(["mmdebstrap", "--variant=minbase", suite, str(rootfs), str(recipe.host_sources())],
                       check=True, capture_output=True, timeout=900)
        store.run("import", str(rootfs), f"localhost/debian:{suite}-slim", timeout=600)
        rootfs.unlink()
        base_s = time.monotonic() - start
        # The repository as a clone has it at HEAD, nothing untracked.
        context = folder / "context"
        context.mkdir()
        archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True,
                                 check=True, timeout=120).stdout
        subprocess.run(["tar", "xf", "-", "-C", str(context)], input=archive, check=True, timeout=120)
        lent = folder / "lent"
        lent.mkdir()
        start = time.monotonic()
        built = subprocess.run([*store.argv, "build", "-f", "Containerfile", "-t", image,
                                "--build-arg", f"DEBIAN={suite}", *lent_pip(lent, HOST_PIP.read_text()),
                                str(context)], capture_output=True, text=True, env=store.env, timeout=BUILD_TIMEOUT)
        build_s = time.monotonic() - start
        (artifacts / "build.log").write_text(built.stdout + built.stderr)
        assert built.returncode == 0, (built.stdout + built.stderr)[-6000:]
        size = int(store.run("image", "inspect", "--format", "{{.Size}}", image).stdout.strip() or 0)
        print(f"Containerfile: base {base_s:.0f} s, podman build {build_s:.0f} s "
              f"({build_s // 60:.0f} min {build_s % 60:.0f} s), image {size / 1e9:.2f} GB", flush=True)
        assert "lent" not in store.run("image", "inspect", "--format", "{{json .Config.Env}}", image).stdout
        changed = _try_nodes(store, image, artifacts / "nodes.log")  # asserted once lab 2 has run

        # The learner's run: JupyterLab on a folder of theirs, the course written into it at the first start.
        work = folder / "work"
        work.mkdir()
        uid = int(store.run("run", "--rm", image, "id", "-u", timeout=120).stdout.strip())
        os.chown(work, uid, uid)  # the image's user writes the mounted folder (Docker Desktop needs no such step)
        settings = lab_settings(folder)
        url, token = _serve(store, image, name, work, settings)
        log = artifacts / "jupyterlab.log"
        script = work / "labs" / "fashion_mnist.py"
        with browser.browser() as page:
            page.goto(f"{url}/lab?token={token}", timeout=180_000)  # the address it printed: logs the browser in
            before = script.read_bytes()
            lab = browser.Lab(url, log, None)
            start = time.monotonic()
            try:
                browser.open_notebook(page, lab, NB)
                state = browser.run_all(page, LAB_TIMEOUT)
                lab_s = time.monotonic() - start
                browser.screenshot(page, artifacts / "02_horovod.png")
            finally:
                log.write_text(store.logs(name))
        print(f"lab 2 in the container (quick mode): {lab_s:.0f} s", flush=True)
        found = browser.problems(state, **EXPECT)
        assert found == [], "\n".join(found)
        text = outputs_text(browser.to_notebook(state, work / NB))
        # What tests/browser/test_notebook_horovod.py asserts of lab 2.
        assert "job finished OK" in text and "Images/sec" in text
        assert "Horovod was not initialised" in text and "hvd.init()" in text
        assert "unrecognized arguments: --checkpoint-dir" in text
        assert "rank 0 of 2: sum of ranks = 1" in text and "rank 1 of 2: sum of ranks = 1" in text
        assert "average [0.5], sum [1.]" in text and "broadcast from 1 [1.], allgather [0. 1.]" in text
        assert "local rank 1" in text and "--- rank 1 ---" in text
        assert re.search(r"^\$ \S*mpirun -np 2 ", text, re.M), text[-3000:]
        assert "engine set stopped" not in text and "cuInit" not in text
        assert "solutions/" not in text and "Traceback" not in text
        # The learner's script untouched, the original kept beside it.
        assert script.read_bytes() == before
        assert (work / "labs" / "fashion_mnist_original.py").exists()
        # Virtual nodes in the image as docs/cloud.md says: root and NET_ADMIN + SYS_ADMIN.
        assert changed == [], "virtual nodes in the image did not end as docs/cloud.md says:\n" + "\n".join(changed)
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.empty()
        assert store.left() == [], f"the test left its store or its mounts: {store.left()}"
        names = subprocess.run([*recipe.podman(), "ps", "-a", "--format", "{{.Names}}"], capture_output=True,
                               text=True, env={**os.environ, **build.podman_env()}, timeout=120).stdout.split()
        assert name not in names, "the test left its container"
