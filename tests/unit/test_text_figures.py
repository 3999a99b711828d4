"""The measured figures of the course's texts come from the reference results (labkit.measure.text_figures)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from labkit.cli import main as cli
from labkit.course import labs
from labkit.measure import text_figures

# A figure with a unit of measurement: images/sec, ms, s, %, "N times", points.
MEASURE = re.compile(r"\b\d[\d,]*(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:images/sec|ms\b|s\b|%|times\b|points\b)")
# Figures of these texts that are not measurements (or are measured elsewhere, and say where), each with why.
NOT_MEASURED = {
    "notebook timings (measured by running the released notebooks; the instructor guide's table says how)": [
        "(162 s measured)", "(404 s measured)", "(333 s measured)", "(698 s measured)", "(449 s measured",
        "check took 36 s", "| 7 s |", "| 37 s |", "| 337 s |", "| 162 s |", "| 404 s |", "| 333 s |", "| 698 s |",
        "| 318 s |", "| 449 s |", "2.4 times slower", "CPU (198 s measured", "| 198 s |",
        "24 short epochs, its cell 77 s",
    ],
    "predictions, before the measurement": [
        "1.75-1.9 (efficiency 88-95%)", '"of ceiling" 93-98%', "1.4-1.5 for 2 workers (efficiency 70-77%)",
        "1.4-1.5, efficiency\n  70-77%", "1.75-1.9 (efficiency\n  88-95%)", "reach 60-90%",
    ],
    "thresholds and definitions": ["100 % means", "Above ~90 % the", "less than 85%", "budget is 6 times",
                                   "stays above 95%"],
    "settings of the lab": [
        "reach 82% vali", "reached 82% in", "run only 20% of", "run only 30% of", "slowed to 20% of",
        "after 60 s by", "1 ms in Horovod", "latency (0.1 ms here)", "latencies of 0.1 ms", "compute 50 ms",
        "in about 50 ms", "or 3 times it",
    ],
    "arithmetic the text shows": [
        "**0.34 s**", "**0.50 s**", "0.34 s and 0.50 s", "**56 ms**", "50 + 56 ms", "= 56 ms", "56 ms per",
        "**600 images/sec**", "**1140 images/sec**", "1140 images/sec (full", "about 55 ms", "the 50 ms of",
        "2 ms step", "0.1 ms = 1.4 ms", "1.4 ms of its 2.4 ms", "1.4 ms of a 2.4 ms", "about 30 ms", "about 3 s per",
    ],
    "the benchmarks of docs/performance.md (repeated runs, with their commands there)": [
        "measured 95% of linear and 98% of the", "README: 95% of linear, 98% of the",
        "measured 77% of linear and 79% of the", "README: 77% of linear, 79% of the", "(848 images/sec against 835",
        "at 769 images/sec",
    ],
}
ALLOWED = [phrase for phrases in NOT_MEASURED.values() for phrase in phrases]


def prose(rel: str) -> str:
    """What a reader of ``rel`` reads: a notebook's markdown cells, or the file."""
    text = (labs.ROOT / rel).read_text()
    if rel.endswith(".ipynb"):
        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "markdown")
    return text


def test_the_figures_in_the_texts_are_those_of_the_reference_results() -> None:
    assert text_figures.generate(check=True) == [], "figures out of date: run `make gen`"


def test_every_figure_is_quoted_and_every_marker_names_a_figure() -> None:
    names = {m["name"] for rel in text_figures.TEXTS for m in text_figures.MARK.finditer(prose(rel))}
    assert names == set(text_figures.FIGURES), (names ^ set(text_figures.FIGURES))


@pytest.mark.parametrize("rel", text_figures.TEXTS)
def test_no_measured_figure_is_typed_by_hand(rel: str) -> None:
    """A figure with a unit outside the markers is a setting, a prediction or arithmetic, listed with why."""
    text = text_figures.MARK.sub("<fig>", prose(rel))
    covered = [range(m.start(), m.end()) for phrase in ALLOWED for m in re.finditer(re.escape(phrase), text)]
    loose = [text[max(0, m.start() - 40):m.end()] for m in MEASURE.finditer(text)
             if not any(m.start() in r and m.end() - 1 in r for r in covered)]
    assert not loose, f"{rel}: figures typed by hand (mark them, or list why they are no measurement): {loose}"


def test_results_made_again_are_rendered_into_the_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(labs.ROOT / "labs" / "reference", tmp_path / "reference")
    monkeypatch.chdir(tmp_path)  # reference.folder() reads ./reference first, as a notebook's cells do
    comm = json.loads((tmp_path / "reference" / "communication.json").read_text())
    fused, unfused = comm["knobs"]["fusion"]["variants"]
    unfused["comm_s"] = 4 * fused["comm_s"]
    (tmp_path / "reference" / "communication.json").write_text(json.dumps(comm))
    text = "unfused took <!--fig:lab8.fusion_ratio-->2.6<!--/fig--> times as long"
    rendered = text_figures.render(text, text_figures.Measured())
    assert rendered == "unfused took <!--fig:lab8.fusion_ratio-->4.0<!--/fig--> times as long"
    assert text_figures.shown(rendered) == "unfused took 4.0 times as long"


def test_a_marker_that_names_no_figure_is_refused() -> None:
    with pytest.raises(text_figures.FigureError, match="no figure called 'lab6.nothing'"):
        text_figures.render("<!--fig:lab6.nothing-->1<!--/fig-->", text_figures.Measured())


def test_make_gen_check_fails_on_a_figure_out_of_date(tmp_path: Path) -> None:
    for rel in text_figures.TEXTS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(labs.ROOT / rel, tmp_path / rel)
    shutil.copytree(labs.ROOT / "labs" / "reference", tmp_path / "labs" / "reference")  # the figures' measurements
    guide = tmp_path / "course" / "INSTRUCTOR.md"
    guide.write_text(guide.read_text().replace("<!--fig:lab6.one_worker_ips-->944", "<!--fig:lab6.one_worker_ips-->1"))
    assert text_figures.generate(tmp_path, check=True) == ["course/INSTRUCTOR.md"]
    assert text_figures.generate(tmp_path) == ["course/INSTRUCTOR.md"]
    assert "<!--fig:lab6.one_worker_ips-->944<!--/fig-->" in guide.read_text()


def _course_copy(tmp_path: Path) -> Path:
    """A copy of this course source, as another course's checkout would be."""
    root = tmp_path / "other-course"
    for rel in ("labs", "solutions", "course"):
        shutil.copytree(labs.ROOT / rel, root / rel)
    shutil.copy(labs.ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_gen_works_on_another_course_root_from_its_own_reference_results(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _course_copy(tmp_path)
    assert cli.main(["gen", "--check", "--root", str(root)]) == 0  # a faithful copy is in sync
    results = root / "labs" / "reference" / "communication.json"
    data = json.loads(results.read_text())
    fused, unfused = data["knobs"]["fusion"]["variants"]
    unfused["comm_s"] = fused["comm_s"] * 2  # that course measured other figures
    results.write_text(json.dumps(data))
    template = root / "solutions" / "source" / "fashion_mnist_ps.py.tmpl"
    template.write_text(template.read_text() + "\n# that course's own line\n")
    ours = {rel: (labs.ROOT / rel).read_bytes() for rel in text_figures.TEXTS}

    capsys.readouterr()
    assert cli.main(["gen", "--check", "--root", str(root)]) == 1
    stale = capsys.readouterr().err
    assert "labs/08_communication.ipynb" in stale and "labs/fashion_mnist_ps.py" in stale
    assert cli.main(["gen", "--root", str(root)]) == 0
    assert cli.main(["gen", "--check", "--root", str(root)]) == 0
    assert "<!--fig:lab8.fusion_ratio-->2.0<!--/fig-->" in (root / "labs" / "08_communication.ipynb").read_text()
    assert (root / "labs" / "fashion_mnist_ps.py").read_text().endswith("# that course's own line\n")
    assert {rel: (labs.ROOT / rel).read_bytes() for rel in text_figures.TEXTS} == ours  # this course untouched


def test_gen_refuses_a_folder_that_is_no_course_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gen", "--check", "--root", str(tmp_path)]) == 1
    assert "is not a course source: it needs solutions/source/" in capsys.readouterr().err
    root = _course_copy(tmp_path)
    (root / "labs" / "reference" / "communication.json").unlink()
    assert cli.main(["gen", "--check", "--root", str(root)]) == 1
    assert "communication.json" in capsys.readouterr().err  # the missing measurement named, no traceback
