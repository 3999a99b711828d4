"""The course's diagrams: drawn by one script, in sync with it, and each shown by a notebook."""

from __future__ import annotations

import re
import subprocess
import sys

from helpers import paths

ROOT = paths.ROOT
FIGURES = ROOT / "labs" / "figures"


def test_committed_figures_are_what_the_script_draws() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "draw_figures.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_every_figure_is_shown_and_every_shown_figure_exists() -> None:
    shown = {m for nb in (ROOT / "labs").glob("*.ipynb") for m in re.findall(r"\(figures/([\w.]+)\)", nb.read_text())}
    drawn = {p.name for p in FIGURES.glob("*.svg")}
    assert len(drawn) >= 6
    assert shown == drawn, f"not shown: {drawn - shown}; missing: {shown - drawn}"
