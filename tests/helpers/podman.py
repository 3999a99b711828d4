"""podman for the container tests: a store of the test's own, the pip settings lent to a container so that pip
reaches the package index on the test machine, and the browser tests' JupyterLab settings handed to a server in a
container. What is lent stays in the tests, never in the product."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from labkit.deploy.image import build, recipe

LENT_CA = "/run/labkit-test-ca.crt"  # where a container finds this machine's certificate bundle
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_PIP = Path("/etc/pip.conf")
SETTINGS_IN = "/run/labkit-test-settings"
CONFIG_IN = "/run/labkit-test-config"
# What the browser test drives JupyterLab through (window.jupyterapp), as tests/helpers/browser.py's server has it.
LAB_CONFIG = {"LabApp": {"expose_app_in_browser": True}}


class Store:
    """podman with a store of its own in ``folder`` (images, containers and their layers)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.argv = [*recipe.podman(), "--root", str(folder / "storage"), "--runroot", str(folder / "run")]
        self.env = {**os.environ, **build.podman_env(folder / "conf")}

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        try:
            out = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"podman {' '.join(args[:3])} did not end in {timeout:.0f} s") from e
        if check and out.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:3])} exited {out.returncode}:\n{out.stdout[-3000:]}\n"
                                 f"{out.stderr[-3000:]}")
        return out

    def logs(self, name: str) -> str:
        """What the container printed; empty when there is no such container (or podman did not answer)."""
        try:
            out = self.run("logs", name, check=False, timeout=120)
        except AssertionError:
            return ""
        return out.stdout + out.stderr if out.returncode == 0 else ""

    def wait_for(self, name: str, pattern: str, timeout: float) -> re.Match[str]:
        """The first match of ``pattern`` in the container's output; an error with the output's end if the
        container stopped or ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while True:
            logs = self.logs(name)
            found = re.search(pattern, logs)
            if found:
                return found
            running = self.run("inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip()
            if running != "true" or time.monotonic() > deadline:
                logs = self.logs(name)  # read again: what it printed before it stopped
                found = re.search(pattern, logs)
                if found:
                    return found
                why = "stopped" if running != "true" else f"still running after {timeout:.0f} s"
                raise AssertionError(f"{name} {why} before printing {pattern!r}:\n{logs[-5000:]}")
            time.sleep(2)

    def empty(self) -> None:
        """Remove every container and image of the store, then the store itself (and whatever else the test put
        in its folder), also when podman does not answer."""
        try:
            self.run("rm", "-a", "-f", "-t", "0", check=False, timeout=300)
            self.run("rmi", "-a", "-f", check=False, timeout=600)
        except AssertionError as e:
            print(f"podman did not empty its store: {e}; removing the folder", flush=True)
        for line in reversed(Path("/proc/mounts").read_text().splitlines()):
            where = line.split()[1]
            if where.startswith(str(self.folder)):
                subprocess.run(["umount", "-l", where], check=False, capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def left(self) -> list[str]:
        """What the store left on this machine: its folder, mounts under it."""
        mounts = [line for line in Path("/proc/mounts").read_text().splitlines() if str(self.folder) in line]
        return ([str(self.folder)] if self.folder.exists() else []) + mounts


def skip_unless_served() -> None:
    """Skip a test that serves JupyterLab from a container to a browser where this machine cannot: no root,
    mmdebstrap, podman or runc, no chromium, or no pip settings to lend."""
    import pytest

    from helpers import browser

    lacking = build.missing_tools()
    if lacking:
        pytest.skip("needs " + ", ".join(lacking))
    if browser.missing():
        pytest.skip(browser.missing())
    if not HOST_PIP.exists() or not HOST_CA.exists():
        pytest.skip("the container reaches the package index only with this machine's pip settings and certificates")


def lent_pip(folder: Path, host_conf: str) -> list[str]:
    """A container's read-only mounts that let pip reach the index here: the certificate bundle at
    :data:`LENT_CA`, this machine's pip settings pointed at it, and the folders under /opt they name. The
    container's own /etc/ssl/certs stays its own (apt may install ca-certificates into it)."""
    text = re.sub(r"(?m)^\s*cert\s*=.*$", f"cert = {LENT_CA}", host_conf)
    if not re.search(r"(?m)^\s*cert\s*=", text):
        text = ("[global]\n" if "[global]" not in text else "") + text
        text = text.replace("[global]\n", f"[global]\ncert = {LENT_CA}\n", 1)
    conf = folder / "pip.conf"
    conf.write_text(text)
    conf.chmod(0o644)
    opts = ["--volume", f"{HOST_CA}:{LENT_CA}:ro", "--volume", f"{conf}:/etc/pip.conf:ro"]
    for top in sorted({m.group(1) for m in re.finditer(r"/opt/([\w.-]+)", host_conf)}):
        opts += ["--volume", f"/opt/{top}:/opt/{top}:ro"]  # never /opt itself: an image's /opt/labkit
    return opts


def lab_settings(folder: Path) -> list[str]:
    """The browser tests' lab settings (no autosave, no windowing) and server configuration (the application
    exposed to the page's scripts), written under ``folder`` and handed to a container's JupyterLab: podman's
    options."""
    from helpers import browser  # playwright and the course's modules: only for the tests that serve a lab

    settings, config = folder / "settings", folder / "config"
    for key, value in browser.SETTINGS.items():
        path = settings / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_lab_config.json").write_text(json.dumps(LAB_CONFIG))
    for p in [settings, *settings.rglob("*"), config, *config.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return ["-v", f"{settings}:{SETTINGS_IN}:ro", "-e", f"JUPYTERLAB_SETTINGS_DIR={SETTINGS_IN}",
            "-v", f"{config}:{CONFIG_IN}:ro", "-e", f"JUPYTER_CONFIG_PATH={CONFIG_IN}"]


def fresh_debian(store: Store, folder: Path, packages: Sequence[str], tag: str, hooks: Sequence[str] = ()) -> None:
    """A fresh minimal Debian (this machine's suite and mirror, ``packages`` included, mmdebstrap's
    ``--customize-hook`` commands ``hooks`` run in it) imported into ``store`` as ``tag``; the root file system's
    tarball is made in ``folder`` and removed."""
    rootfs = folder / "rootfs.tar"
    subprocess.run(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(packages),
                    *(f"--customize-hook={h}" for h in hooks),
                    recipe.host_suite(), str(rootfs), str(recipe.host_sources())],
                   check=True, capture_output=True, timeout=900)
    store.run("import", str(rootfs), tag)
    rootfs.unlink()
