"""``labkit lab``: JupyterLab on the learner's course, the course written into the folder at its first start.

What the course image runs by default: ``podman run -p 8888:8888 -v WORK:/home/labkit/work IMAGE`` serves
JupyterLab on ``WORK`` and prints its address with the login token; the course is released into ``WORK`` the
first time (:func:`labkit.course.release.first_start`) and every later start leaves the learner's files as
they are. ``make lab`` in a checkout of the course source is the same JupyterLab on ``labs/``.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit.course import release, sources

START = Path("labs") / "00_start_here.ipynb"


@dataclass(frozen=True)
class LabOptions:
    """Where and how JupyterLab serves the course."""

    folder: Path
    ip: str = "127.0.0.1"
    port: int = 8888
    root: bool = False  # running as root (JupyterLab refuses without --allow-root)
    settings: Path | None = None  # the course's JupyterLab settings (jupyter/lab-settings)


def lab_command(jupyter: str, o: LabOptions) -> list[str]:
    """The JupyterLab command line for ``o`` (reads no state)."""
    argv = [jupyter, "lab", f"--ServerApp.root_dir={o.folder}", f"--ip={o.ip}", f"--port={o.port}",
            "--no-browser"]
    if o.root:
        argv.append("--allow-root")
    if o.settings is not None:
        argv.append(f"--LabApp.app_settings_dir={o.settings}")
    return [*argv, str(START)]


def add_cli(sub) -> None:
    """Register ``labkit lab``."""
    p = sub.add_parser("lab", help="JupyterLab on your course (written into the folder at its first start)")
    p.add_argument("--dir", default=".", help="the folder of your work (default: here); the course is written "
                   "into it where a file of it is missing, never over one of yours")
    p.add_argument("--ip", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=8888, help="port (default: %(default)s)")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    folder = Path(a.dir).resolve()
    jupyter = shutil.which("jupyter") or str(Path(sys.executable).with_name("jupyter"))
    if not Path(jupyter).exists():
        print("labkit lab: JupyterLab is not installed in this environment (`make setup` installs it)",
              file=sys.stderr)
        return 2
    try:
        root = sources.course_source()
        written = release.first_start(folder, root)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"labkit lab: {e}", file=sys.stderr)
        return 2
    print(f"labkit lab: the course {'written into' if written else 'already in'} {folder}"
          + (f" ({len(written)} files)" if written else "; your files are left as they are"), flush=True)
    settings = next((d for d in (folder / "jupyter" / "lab-settings", root / "jupyter" / "lab-settings")
                     if d.is_dir()), None)
    argv = lab_command(jupyter, LabOptions(folder, a.ip, a.port, os.geteuid() == 0, settings))
    os.chdir(folder)
    os.execv(argv[0], argv)  # JupyterLab prints its address with the token; Ctrl-C stops it
    return 0  # not reached
