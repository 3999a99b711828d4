"""`make lab` serves the course: JupyterLab starts in labs/ and opens the first notebook."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import paths

ROOT = paths.ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_the_start_notebook() -> None:
    port = _free_port()
    jupyter = Path(sys.executable).parent / "jupyter"
    args = ["make", "-s", "-o", "setup", "lab", f"PORT={port}",
            "LAB_ARGS=--no-browser --ServerApp.token= --ServerApp.password="]
    env = {**os.environ, "PATH": f"{jupyter.parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    try:
        deadline = time.time() + 90
        body = ""
        while time.time() < deadline:
            try:
                url = f"http://127.0.0.1:{port}/api/contents/00_start_here.ipynb?content=0"
                body = urllib.request.urlopen(url, timeout=5).read().decode()
                break
            except OSError:
                time.sleep(1)
        assert '"name": "00_start_here.ipynb"' in body or '"name":"00_start_here.ipynb"' in body, body
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
