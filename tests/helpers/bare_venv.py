"""A fresh virtual environment that sees this one's packages but not this checkout's ``labkit``.

It is made from the same base Python, without pip, and sees this environment's ``site-packages``
(TensorFlow, Horovod, ...) through a ``.pth`` file holding that folder's path: nothing is
downloaded. A path line adds the folder to ``sys.path`` and nothing else; the ``.pth`` files inside
it are not run, among them the editable install's finder that maps ``labkit`` to this checkout
and labkit's start-up hook. So ``import labkit`` fails there until a wheel is installed into it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

PTH = "project_environment.pth"


def create(folder: Path) -> Path:
    """Make the environment in ``folder``; return its ``python``."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    out = subprocess.run([str(base), "-m", "venv", "--without-pip", str(folder)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    here = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    (Path(site) / PTH).write_text("".join(f"{p}\n" for p in here))
    return python


def environ(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``folder``'s ``bin`` first on PATH and no
    PYTHONPATH, VIRTUAL_ENV or PYTHONHOME: ``python`` is the fresh environment's."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{folder / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env
