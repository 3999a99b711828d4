"""labkit lab: the JupyterLab command line, and the course written into a folder only where it is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.cli import lab
from labkit.course import labs, release


def test_the_command_line_says_where_and_how() -> None:
    o = lab.LabOptions(Path("/home/labkit/work"), "0.0.0.0", 8888, root=False, settings=Path("/s"))
    assert lab.lab_command("/v/bin/jupyter", o) == [
        "/v/bin/jupyter", "lab", "--ServerApp.root_dir=/home/labkit/work", "--ip=0.0.0.0", "--port=8888",
        "--no-browser", "--LabApp.app_settings_dir=/s", "labs/00_start_here.ipynb"]
    assert "--allow-root" in lab.lab_command("jupyter", lab.LabOptions(Path("/w"), root=True))


def test_the_first_start_writes_the_course_and_later_starts_keep_the_learners_files(tmp_path: Path) -> None:
    work = tmp_path / "work"
    written = release.first_start(work, labs.ROOT, "self-paced")
    assert "labs/00_start_here.ipynb" in written and "labs/fashion_mnist.py" in written
    assert not (work / "solutions").exists() and (work / ".labkit" / "solutions").is_dir()
    mine = work / "labs" / "fashion_mnist.py"
    mine.write_text("# my work\n")
    (work / "labs" / "02_horovod.ipynb").unlink()  # a notebook the learner deleted comes back
    again = release.first_start(work, labs.ROOT, "self-paced")
    assert again == ["labs/02_horovod.ipynb"] and mine.read_text() == "# my work\n"
    with pytest.raises(ValueError, match="another folder"):
        release.first_start(labs.ROOT, labs.ROOT)
