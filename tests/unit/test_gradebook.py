"""labkit class gradebook: the CSV Canvas's and Moodle's gradebook imports read, from grade results and class
records, with the points of the course's grading configuration."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from helpers import paths

from labkit.cli import main as cli
from labkit.course import labs
from labkit.grading import reports
from labkit.grading.grade import Case, Result
from labkit.workshop import gradebook

COURSE = '''[tool.labkit.grading]
labs = ["horovod", "mirrored"]
path = "labs"

[tool.labkit.grading.points]
horovod = [1, 1, 2, 2, 0.5, 0.5, 1, 4]
mirrored = 6
'''


def _result(horovod_passed: int, mirrored_passed: int) -> Result:
    config = {"points": {"horovod": [1, 1, 2, 2, 0.5, 0.5, 1, 4], "mirrored": 6}}
    from labkit.grading import grade

    cases = []
    for name, passed in (("horovod", horovod_passed), ("mirrored", mirrored_passed)):
        lab = labs.get(name)
        for k, points in enumerate(grade.step_points(lab, config), 1):
            ok = k <= passed
            cases.append(Case(name, k, lab.step_title(k), ok, "" if ok else f"step {k} fails", points if ok else 0.0,
                              points))
    return Result("labs", cases, 1.0)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A folder of `labkit grade` results as a course collects them: JSON, JUnit and an old Classroom JSON."""
    folder = tmp_path / "results"
    (folder / "alice").mkdir(parents=True)
    (folder / "alice" / "grade.json").write_text(json.dumps(_result(8, 4).to_dict()))
    (folder / "bob.xml").write_text(reports.junit_xml(_result(3, 1)))
    (folder / "carol.json").write_text(json.dumps({"version": 1, "status": "fail", "max_score": 1, "tests": [
        {"name": "horovod step 1: init", "status": "pass", "score": 1, "max_score": 1, "message": ""}]}))
    return folder


@pytest.fixture
def course_dir(tmp_path: Path) -> Path:
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "pyproject.toml").write_text(COURSE)
    return tmp_path / "course"


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_canvas_csv_header_points_row_and_learners(results: Path, course_dir: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["class", "gradebook", "--format", "canvas", "--from", str(results),
                     "--course", str(course_dir)]) == 0
    out = capsys.readouterr().out
    assert "\r\n" in out  # RFC 4180 line ends
    rows = _csv(out)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "horovod", "mirrored"]
    assert rows[1] == ["    Points Possible", "", "", "", "", "12", "6"]
    assert rows[2:] == [["alice", "", "", "alice", "", "12", "6"],
                        ["bob", "", "", "bob", "", "4", "1.5"],
                        ["carol", "", "", "carol", "", "1", "0"]]
    # What Canvas's importer requires of the header: Student, then ID, and Section last of the student columns.
    assert "Student" in rows[0][0] and "ID" in rows[0][1] and rows[0][4] == "Section"


def test_moodle_csv_and_a_roster(results: Path, course_dir: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    roster = tmp_path / "roster.csv"
    roster.write_text("learner,username,email,first name\nalice,a.liddell,alice@example.org,Alice\n"
                      "dave,dave,dave@example.org,Dave\n", encoding="utf-8")
    out = tmp_path / "moodle.csv"
    assert cli.main(["class", "gradebook", "--format", "moodle", "--from", str(results), "--course", str(course_dir),
                     "--roster", str(roster), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "not in the roster (written under their labkit name): bob, carol" in err
    assert "in the roster without any result (no row): dave" in err
    rows = _csv(out.read_text(encoding="utf-8"))
    assert rows == [["username", "email", "horovod", "mirrored"], ["a.liddell", "alice@example.org", "12", "6"],
                    ["bob", "", "4", "1.5"], ["carol", "", "1", "0"]]  # no points row: Moodle reads users only


def test_canvas_roster_fills_the_identity_columns(results: Path, course_dir: Path, tmp_path: Path) -> None:
    export = tmp_path / "canvas-export.csv"  # Canvas's own export, with a learner column added
    export.write_text("Student,ID,SIS User ID,SIS Login ID,Section,learner,Quiz 1\n"
                      "    Points Possible,,,,,,10\n\"Liddell, Alice\",1234,S01,aliddell,Lab A,alice,9\n")
    roster = gradebook.read_roster(export, "canvas")
    assert roster == {"alice": {"Student": "Liddell, Alice", "ID": "1234", "SIS User ID": "S01",
                                "SIS Login ID": "aliddell", "Section": "Lab A"}}
    rows_, learners, _ = gradebook.read_records(results)
    book = gradebook.build(rows_, gradebook.columns(gradebook.course_config(course_dir)), learners)
    table = gradebook.rows(book, "canvas", roster)
    assert table[2] == ["Liddell, Alice", "1234", "S01", "aliddell", "Lab A", "12", "6"]
    assert 'Liddell, Alice"' in gradebook.to_csv(table)  # quoted: a comma inside


def test_class_records_count_the_latest_result_of_each_step(tmp_path: Path) -> None:
    """A workshop's records (copied class folder): a step passed then failed counts as failed."""
    folder = tmp_path / "class"
    shutil.copytree(paths.FIXTURES / "classview", folder)
    rows, learners, problems = gradebook.read_records(folder)
    assert learners == ["learner01", "learner02", "learner03"] and problems  # the fixture's broken lines
    config = gradebook.course_config(tmp_path)  # no table: the one a released course gets
    cols = gradebook.columns(config)
    assert [c.name for c in cols] == ["horovod", "mirrored", "multiworker", "parameter-server", "communication",
                                      "at-scale"]
    book = gradebook.build(rows, cols, learners)
    assert book.learners == ["learner01", "learner02", "learner03"]
    assert book.points["learner01"]["horovod"] == 2 and book.points["learner03"] == dict.fromkeys(
        [c.name for c in cols], 0)


def test_the_assessment_is_a_column_and_unsafe_names_are_left_out(tmp_path: Path) -> None:
    from labkit.records import classlog

    config = {"labs": ["mirrored"], "points": {"mirrored": 4}, "assessment": {"points": 5}}
    cols = gradebook.columns(config)
    assert [(c.name, c.max_points) for c in cols] == [("mirrored", 4), ("assessment", 5)]
    rows = [classlog.make_record("ann", "assessment", 1, True, "", 1.0),
            classlog.make_record("=HYPERLINK(1)", "mirrored", 1, True, "", 1.0),
            classlog.make_record("ann", "scale-out", 1, True, "", 1.0)]
    book = gradebook.build(rows, cols)
    assert book.learners == ["ann"] and book.points["ann"] == {"mirrored": 0, "assessment": 5}
    assert any("left out '=HYPERLINK(1)'" in n for n in book.notes)
    assert any("does not grade were left out: scale-out" in n for n in book.notes)
    with pytest.raises(gradebook.GradebookError, match="no lab"):
        gradebook.columns({"labs": ["nolab"]})


def test_a_roster_without_a_learner_column_is_refused(tmp_path: Path) -> None:
    roster = tmp_path / "r.csv"
    roster.write_text("username,email\nx,y\n")
    with pytest.raises(gradebook.GradebookError, match="no 'learner' column"):
        gradebook.read_roster(roster, "moodle")


def test_the_class_records_are_exported_only_when_asked_for_as_self_reported(capsys) -> None:  # noqa: ANN001
    assert cli.main(["class", "gradebook", "--format", "canvas"]) == 2
    assert "can forge" in capsys.readouterr().err
