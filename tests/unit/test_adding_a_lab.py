"""Adding a lab touches only its own files (docs/adding-a-lab.md): a small lab, ``sharding``, is written into a copy
of the course in a temporary folder (its template, its notebook, its judge module), declared in the two tables
(:data:`labkit.course.labs.LABS`, :data:`labkit.check.judges.JUDGES`) and nowhere else, and then generated,
checked, released and graded through the commands a course author and a learner run.

The lab is cheap: its script is plain Python (no TensorFlow) that prints the items one worker of a data set reads;
its judges run it as 3 workers and look at what they print, as lab 7's judges look at files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import labkit.check
from labkit.check import judges, judging
from labkit.cli import main as cli
from labkit.core import contract, env
from labkit.course import labs, sources
from labkit.records.evidence import EvidenceError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# ----------------------------------------------------------------------------- the new lab's own files

LAB = labs.Lab("sharding", "Sharding the data: each worker its own part", (
    "each worker reads its own part of the items, every item read by exactly one worker",
    "--shuffle SEED: the items shuffled the same way on every worker before they are split",
), "shard.py", "10_sharding.ipynb", 30.0, 4)

TEMPLATE = '''\
"""{title}: the items of a data set this worker reads.

    python {name} --items 12 --workers 3 --rank 1 [--shuffle SEED]

prints one JSON line: this worker's rank and the items it reads, in order.
"""

import argparse
import json
import random


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--items", type=int, default=12, help="how many items the data set has")
    p.add_argument("--workers", type=int, default=1, help="how many workers read it")
    p.add_argument("--rank", type=int, default=0, help="this worker's rank, 0..workers-1")
    #% step 2
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED", help="shuffle the items first, with SEED")
    #% else
    # TODO: Step 2: --shuffle SEED: shuffle the items before they are split, the same way on every worker
    #% end
    a = p.parse_args()
    items = list(range(a.items))
    #% step 2
    if a.shuffle is not None:
        random.Random(a.shuffle).shuffle(items)  # the same seed on every worker: the same order on every worker
    #% end
    #% step 1
    mine = items[a.rank::a.workers]  # every item read by exactly one worker
    #% else
    # TODO: Step 1: keep only this worker's part of the items, every item read by exactly one worker
    mine = items
    #% end
    print(json.dumps({"rank": a.rank, "items": mine}))


if __name__ == "__main__":
    main()
'''

JUDGE = '''\
"""The sharding lab's judges: what the learner's script prints as each of 3 workers, run as plain Python."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from labkit.check.verdict import Failed
from labkit.records.evidence import Evidence

ITEMS, WORKERS, SEED = 12, 3, 7
PLAIN = f"with --items {ITEMS} --workers {WORKERS}"
SHUFFLED = f"with --shuffle {SEED}"


@dataclass(frozen=True)
class Printed:
    """What one worker printed: its items, or why there are none."""

    items: list[int] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Sharding(Evidence):
    """The check's evidence: what each of the 3 workers printed, without and with --shuffle."""

    plain: list[Printed] = field(default_factory=list)
    shuffled: list[Printed] = field(default_factory=list)


EVIDENCE = Sharding  # what collect returns and the judges read


def run(script: Path, rank: int, extra: list[str], timeout: float, work: Path) -> Printed:
    """What the script prints as worker ``rank``: its items, or why there are none."""
    argv = [sys.executable, "-I", str(script), "--items", str(ITEMS), "--workers", str(WORKERS), "--rank", str(rank),
            *extra]
    try:
        p = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Printed(error=f"still running after {timeout:.0f} s")
    try:
        items = json.loads(p.stdout.strip().splitlines()[-1])["items"]
    except (IndexError, ValueError, KeyError, TypeError):
        return Printed(error=f"exit code {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}")
    ok = isinstance(items, list) and all(isinstance(i, int) for i in items)
    return Printed(items=items) if ok else Printed(error=f"its items are not a list of numbers: {items!r}")


def collect(script: Path, upto: int, timeout: float, work: Path) -> Sharding:
    each = timeout / (2 * WORKERS)
    return Sharding(plain=[run(script, r, [], each, work) for r in range(WORKERS)],
                    shuffled=[run(script, r, ["--shuffle", str(SEED)], each, work) for r in range(WORKERS)])


def partition(runs: list[Printed], how: str) -> list[list[int]]:
    """Each worker's items; Failed unless every item is read by exactly one worker."""
    for rank, r in enumerate(runs):
        if r.items is None:
            raise Failed(f"worker {rank} of {WORKERS} ({how}) printed no items: {r.error}")
    parts = [r.items or [] for r in runs]
    for i in range(ITEMS):
        who = [rank for rank, part in enumerate(parts) for item in part if item == i]
        if len(who) > 1:
            raise Failed(f"item {i} is read {len(who)} times, by ranks {', '.join(map(str, who))} ({how}): keep "
                         "only this worker's part of the items, so that every item is read by exactly one worker.")
        if not who:
            raise Failed(f"no worker reads item {i} ({how}): every item must be read by one worker.")
    strange = sorted({i for part in parts for i in part} - set(range(ITEMS)))
    if strange:
        raise Failed(f"the workers read items {strange}, which the data set does not have ({how}).")
    return parts


def step_1(ev: Sharding) -> str:
    parts = partition(ev.plain, PLAIN)
    return f"the {WORKERS} workers read {', '.join(str(len(p)) for p in parts)} items, each of the {ITEMS} once."


def step_2(ev: Sharding) -> str:
    plain, mixed = partition(ev.plain, PLAIN), partition(ev.shuffled, SHUFFLED)
    if mixed == plain:
        raise Failed(f"{SHUFFLED} every worker reads the same items in the same order as without it: shuffle the "
                     "items with the seed before they are split.")
    return f"{SHUFFLED} the items are shuffled the same way on every worker, each still read once."


STEPS = [step_1, step_2]
'''


def _cell(kind: str, text: str) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True)}
    return {**cell, "execution_count": None, "outputs": []} if kind == "code" else cell


ANSWER = "<details><summary>Answer</summary>\n\n{}\n\n</details>"
NOTEBOOK = {"cells": [
    _cell("markdown", "# Lab 10 — Sharding the data\n\nEach worker of a data-parallel job reads its own part of the "
                      "data set. About 10 minutes: step 1 (5 min), step 2 (5 min)."),
    _cell("code", 'import labkit.check\n\nSCRIPT = "shard.py"  # your script'),
    _cell("markdown", "## Step 1: each worker its own part\n\nIn `shard.py`, at `TODO: Step 1`, keep only this "
                      "worker's items.\n\n**Predict, then run.** How many workers read item 0 in the starter?"),
    _cell("code", "labkit.check.sharding(1, script=SCRIPT)"),
    _cell("markdown", ANSWER.format("All 3: every worker reads the whole data set.")),
    _cell("markdown", "## Step 2: shuffled the same way everywhere\n\nAt `TODO: Step 2`, add `--shuffle SEED`.\n\n"
                      "**Predict, then run.** What goes wrong with a seed of `SEED + rank`?"),
    _cell("code", "labkit.check.sharding(2, script=SCRIPT)"),
    _cell("markdown", ANSWER.format("The workers split different orders: some items are read twice, some never.")),
], "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5}

OWN_FILES = [f"solutions/source/{LAB.stem}.py.tmpl", f"labs/{LAB.notebook}"]  # what the author writes by hand
GENERATED = [f"labs/{LAB.starter}", *(f"solutions/{LAB.solution(k).name}" for k in (1, 2))]  # what `gen` writes

# ----------------------------------------------------------------------------- a course with the new lab in it


def _declare() -> str:
    """A ``sitecustomize`` that declares the lab in every Python process started with its folder on its path: the
    check ``labkit grade`` runs for each lab is a process of its own, which reads the tables from their source."""
    return (f"# the {LAB.name} lab of tests/unit/test_adding_a_lab.py, declared in this process too\n"
            "import lab_sharding\nfrom labkit.check import judges\nfrom labkit.course import labs\n"
            "from labkit.course.labs import Lab\n\n"
            f"labs.LABS[{LAB.name!r}] = {LAB!r}\njudges.JUDGES[{LAB.name!r}] = lab_sharding\n")


@pytest.fixture
def course(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the course source with the new lab's files in it, the lab declared in the two tables only."""
    assert not [f for f in OWN_FILES + GENERATED if (labs.ROOT / f).exists()], "the repository has the lab already"
    root = tmp_path / "course"
    (root / "solutions").mkdir(parents=True)
    shutil.copy2(labs.ROOT / "pyproject.toml", root)
    shutil.copytree(labs.ROOT / "solutions" / "source", root / "solutions" / "source")
    for folder in ("labs", "solutions"):  # the starters, the notebooks, the step solutions: the course as it is
        (root / folder).mkdir(exist_ok=True)
        for p in (labs.ROOT / folder).iterdir():
            if p.is_file() and not p.name.endswith(".bak"):
                shutil.copy2(p, root / folder / p.name)
    stale = set(sources.generate(check=True, root=root))  # before the lab: what the copy lacks (nothing, in sync)
    # The new lab's own files, and nothing else.
    (root / OWN_FILES[0]).write_text(TEMPLATE)
    (root / OWN_FILES[1]).write_text(json.dumps(NOTEBOOK, indent=1, ensure_ascii=False) + "\n")
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / "lab_sharding.py").write_text(JUDGE)
    (ext / "sitecustomize.py").write_text(_declare())
    monkeypatch.syspath_prepend(str(ext))
    monkeypatch.delitem(sys.modules, "lab_sharding", raising=False)
    import lab_sharding  # the judge module, a real file as a course author writes it
    monkeypatch.setitem(sys.modules, "lab_sharding", lab_sharding)  # gone from sys.modules after the test

    assert set(sources.generate(check=True, root=root)) == stale, "not declared yet: gen does not know the lab"
    monkeypatch.setitem(labs.LABS, LAB.name, LAB)
    monkeypatch.setitem(judges.JUDGES, LAB.name, lab_sharding)
    # Nothing outside tmp_path: no check queue, no class record, temporary folders and caches in tmp_path.
    for name in (contract.CHECK_SLOTS, contract.CHECK_QUEUE, contract.CLASS_DIR, contract.SOLUTIONS_DIR):
        monkeypatch.delenv(name, raising=False)
    for key, value in env.DEFAULTS.items():  # what `labkit` sets, put back after the test
        monkeypatch.setenv(key, os.environ.get(key, value))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv(contract.CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ext), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setattr(judging, "_CACHE", {})
    monkeypatch.setattr(sources, "ROOT", root)  # the course source `labkit gen` and `labkit release` work on
    written = sources.generate()  # what `labkit gen` does for the starters and the step solutions
    assert set(written) - stale == set(GENERATED)  # the new lab's files, and only those
    yield root
    assert not list((tmp_path / "tmp").iterdir()), "a check left its temporary folders behind"
    assert not [f for f in OWN_FILES + GENERATED if (labs.ROOT / f).exists()], "the repository was written to"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(argv)
    return code, capsys.readouterr().out


# ----------------------------------------------------------------------------- the tests


def test_gen_writes_the_starter_and_step_solutions_from_the_template(course: Path) -> None:
    starter = (course / "labs" / "shard.py").read_text()
    step_1, step_2 = (course / "solutions" / LAB.solution(k).name for k in (1, 2))
    assert starter.startswith("# Generated from solutions/source/shard.py.tmpl (version 0) by `labkit gen`.")
    assert "TODO: Step 1:" in starter and "TODO: Step 2:" in starter and "#%" not in starter
    assert "sharding lab, starting point: the items" in starter  # {title}, filled in
    assert "TODO: Step 1" not in step_1.read_text() and "TODO: Step 2:" in step_1.read_text()
    assert "TODO" not in step_2.read_text() and "random.Random(a.shuffle)" in step_2.read_text()
    assert sources.generate(check=True) == []  # in sync


def test_check_passes_the_solution_and_fails_the_starter_at_step_1(course: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["check", "sharding", str(course / "labs" / "shard.py"), "--json"], capsys)
    report = json.loads(out)
    assert (code, report["first_failing_step"]) == (1, 1)
    assert report["steps"][0]["message"].startswith(f"{LAB.steps[0]}: item 0 is read 3 times, by ranks 0, 1, 2")
    assert report["steps"][1] == {"step": 2, "passed": False, "message": "not checked: fix step 1 first."}

    code, out = _run(["check", "sharding", str(course / "solutions" / LAB.solution(1).name), "--json"], capsys)
    report = json.loads(out)
    assert (code, [s["passed"] for s in report["steps"]]) == (1, [True, False])
    assert "printed no items" in report["steps"][1]["message"] and "--shuffle" in report["steps"][1]["message"]

    code, out = _run(["check", "sharding", str(course / "solutions" / LAB.solution(2).name)], capsys)
    assert code == 0 and "all steps pass" in out and "the 3 workers read 4, 4, 4 items" in out

    # A shuffle with a seed of each worker's own splits different orders: behaviour is judged, not spelling.
    wrong = course / "work" / "shard.py"
    wrong.parent.mkdir()
    wrong.write_text((course / "solutions" / LAB.solution(2).name).read_text().replace(
        "random.Random(a.shuffle)", "random.Random(a.shuffle + a.rank)"))
    code, out = _run(["check", "sharding", str(wrong), "--json"], capsys)
    report = json.loads(out)
    assert (code, report["first_failing_step"]) == (1, 2)
    assert "(with --shuffle 7): every item must be read by one worker" in report["steps"][1]["message"]
    # --shuffle taken, and nothing shuffled.
    wrong.write_text((course / "solutions" / LAB.solution(2).name).read_text().replace(
        "random.Random(a.shuffle).shuffle(items)", "items = items"))
    code, out = _run(["check", "sharding", str(wrong), "--json"], capsys)
    report = json.loads(out)
    assert (code, report["first_failing_step"]) == (1, 2) and "in the same order" in report["steps"][1]["message"]


def test_the_labs_own_evidence_is_saved_and_read_back_as_its_dataclass(course: Path, tmp_path: Path) -> None:
    """The lab declares its evidence as a dataclass (``EVIDENCE``): the check keeps it, writes it as JSON and reads it
    back as that class; a file of the wrong shape is refused, named."""
    out = tmp_path / "evidence.json"
    report = labkit.check.run_check(LAB.name, course / "solutions" / LAB.solution(2).name, evidence_out=out)
    assert report.passed and type(report.evidence).__name__ == "Sharding"
    assert judging.load(out, LAB.name) == report.evidence
    saved = json.loads(out.read_text())
    assert saved["plain"][1] == {"items": [1, 4, 7, 10], "error": None} and saved["covers"] == 2
    out.write_text(json.dumps({**saved, "plain": [{"items": "all"}]}))
    with pytest.raises(EvidenceError, match=r"evidence.json: .*evidence.plain\[0\].items: expected a list"):
        judging.load(out, LAB.name)


def test_the_notebook_check_cells_call_the_labs_check_function(course: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert labkit.check.sharding.__name__ == "sharding" and LAB.title in labkit.check.sharding.__doc__
    assert "sharding" in labkit.check.__all__  # read from the registry when asked, not when labkit.check was imported
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["check"].format_help()
    assert "sharding" in help_text and f"sharding {LAB.timeout:.0f}" in " ".join(help_text.split())
    cells = ["".join(c["source"]) for c in json.loads((course / "labs" / LAB.notebook).read_text())["cells"]
             if c["cell_type"] == "code"]
    setup, checks = cells[0], [c for c in cells if c.startswith("labkit.check.sharding(")]
    assert len(checks) == LAB.n_steps
    learner = course / "learner"
    learner.mkdir()
    monkeypatch.chdir(learner)
    for script, passed in ((course / "labs" / "shard.py", [False, False]),
                           (course / "solutions" / LAB.solution(2).name, [True, True])):
        shutil.copy2(script, learner / "shard.py")
        ns: dict = {}
        exec(setup, ns)
        report = eval(checks[-1], ns)
        assert [s.passed for s in report.steps] == passed
    assert (learner / "runs" / "checks.jsonl").is_file()  # the learner's check record, next to the script


def test_release_gives_the_learner_the_starter_and_notebook_and_the_grading_table_lists_the_lab(
        course: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "release"
    code, _ = _run(["release", str(out), "--solutions", "graded"], capsys)
    assert code == 0
    assert (out / "labs" / "shard.py").read_text() == (course / "labs" / "shard.py").read_text()
    assert (out / ".labkit" / "starters" / "shard.py").read_text() == (course / "labs" / "shard.py").read_text()
    assert "labkit.check.sharding(2, script=SCRIPT)" in (out / "labs" / LAB.notebook).read_text()
    assert not (out / "solutions").exists() and not (out / ".labkit" / "solutions").exists()
    assert not [p for p in out.rglob("*") if "_after_step_" in p.name or p.name.endswith(".tmpl")]
    table = tomllib.loads((out / "pyproject.toml").read_text())["tool"]["labkit"]
    assert "sharding" in table["grading"]["labs"] and table["grading"]["points"]["sharding"] == 4
    assert table["course"]["solutions"] == "graded"

    open_course = tmp_path / "self-paced"
    code, _ = _run(["release", str(open_course), "--solutions", "self-paced"], capsys)
    assert code == 0
    given = open_course / ".labkit" / "solutions" / LAB.solution(2).name
    assert "random.Random(a.shuffle)" in given.read_text() and not (open_course / "solutions").exists()


def test_grade_gives_the_lab_its_points(course: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "release"
    assert _run(["release", str(out), "--solutions", "graded"], capsys)[0] == 0

    def grade() -> tuple[int, dict]:
        code, text = _run(["grade", str(out / "labs"), "--lab", "sharding", "--json"], capsys)
        return code, json.loads(text)

    code, result = grade()  # the starter as handed out: not started, no run
    assert (code, result["score"], result["max_score"]) == (1, 0, 4)
    assert all(c["message"].startswith("not started") for c in result["cases"])

    shutil.copy2(course / "solutions" / LAB.solution(1).name, out / "labs" / "shard.py")
    code, result = grade()  # step 1 done: its half of the points, step 2 failed with the judge's message
    assert (code, result["score"]) == (1, 2)
    assert [(c["step"], c["passed"], c["points"]) for c in result["cases"]] == [(1, True, 2), (2, False, 0)]
    assert "--shuffle" in result["cases"][1]["message"]

    shutil.copy2(course / "solutions" / LAB.solution(2).name, out / "labs" / "shard.py")
    code, result = grade()  # finished: every point
    assert (code, result["score"], result["max_score"], result["passed"]) == (0, 4, 4, True)
