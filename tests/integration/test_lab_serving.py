"""labkit lab for real: JupyterLab serves the course it wrote into the learner's folder."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labkit.core import tfconfig


@pytest.mark.slow
def test_labkit_lab_serves_the_course_in_its_folder(tmp_path: Path, running) -> None:
    """`labkit lab --dir WORK` writes the course into WORK and JupyterLab answers there, its token printed."""
    work = tmp_path / "work"
    port = tfconfig.free_ports(1)[0]
    server = subprocess.Popen([sys.executable, "-m", "labkit.cli", "lab", "--dir", str(work), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = ""
        deadline = time.monotonic() + 60
        assert server.stdout is not None
        while "token=" not in seen and time.monotonic() < deadline:
            seen += server.stdout.readline()
        assert "the course written into" in seen and "token=" in seen, seen
        url = re.search(r"(http://127\.0\.0\.1:\d+)/lab\?token=(\w+)", seen)
        assert url, seen
        names: set[str] = set()
        for _ in range(20):  # the address is printed as the server starts listening
            try:
                with urllib.request.urlopen(f"{url[1]}/api/contents/labs?token={url[2]}", timeout=10) as r:
                    names = {item["name"] for item in json.load(r)["content"]}
                break
            except OSError:
                assert server.poll() is None, seen + server.stdout.read()
                time.sleep(0.5)
        assert "00_start_here.ipynb" in names and "fashion_mnist.py" in names
    finally:
        server.terminate()
        server.wait(30)
    assert not running(f"--port={port}")
    assert (work / "labs" / "fashion_mnist.py").is_file()
