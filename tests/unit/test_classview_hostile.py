"""The class view against a hostile learner's record file: every bad line is named and skipped, the rest shown.

A learner writes their own ``CLASS_DIR/LEARNER.jsonl`` by hand. Whatever is in it, the view (text, JSON, HTML and
``labkit class status``) is built, the good records of every learner still appear, the bad line is named with its
file and line, learners' text reaches the terminal with its control characters shown, not obeyed, and the view
of many records is built in time linear in their number.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.cli import classes as classes_cli
from labkit.core.cliargs import Parser
from labkit.records import boundedjson, classlog
from labkit.workshop import classpage, classview

T0 = 1764072000.0
GOOD = [  # learner01's good records, around the hostile line
    {"lab": "horovod", "step": 1, "passed": True, "message": "", "time": T0},
    {"lab": "horovod", "step": 2, "passed": False, "message": "the gradients were not averaged", "time": T0 + 60},
]
OTHER = {"lab": "horovod", "step": 1, "passed": False, "message": "hvd.init() was not called", "time": T0 + 30}
ESCAPES = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u200f", "\u2028", "\r", "\x00")


def _line(**changed: object) -> str:
    """A record line of step 3 with ``changed`` fields (as JSON text, so NaN or 1e300 stay what they are)."""
    fields = {"lab": '"horovod"', "step": "3", "passed": "true", "message": '"ok"', "time": str(T0 + 120)}
    fields.update({k: str(v) for k, v in changed.items()})
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


def _folder(tmp_path: Path, bad: bytes | str) -> Path:
    """A copy of a class folder: learner01's file with ``bad`` as its line 2, and learner02's good file."""
    folder = tmp_path / "class"
    folder.mkdir(parents=True)
    bad = bad.encode() if isinstance(bad, str) else bad
    good = [json.dumps(row).encode() for row in GOOD]
    (folder / "learner01.jsonl").write_bytes(b"\n".join([good[0], bad, good[1]]) + b"\n")
    (folder / "learner02.jsonl").write_text(json.dumps(OTHER) + "\n")
    return folder


def _shown(tmp_path: Path, bad: bytes | str, why: str) -> classview.View:
    """The view of the folder with ``bad``: built, rendered every way, the good records in it, the bad line named."""
    folder = _folder(tmp_path, bad)
    reading = classlog.read(folder, by_owner=False)
    view = classview.build(reading.records, ["learner01", "learner02"], reading.problems, reading.reveals)
    text, page = view.text(), classpage.html_page(view, refresh=10)
    data = json.dumps(view.to_dict())
    for out in (text, page, data):
        out.encode()  # every rendering is UTF-8 text (a terminal, a tornado response)
    assert [(r.learner, r.step, r.passed) for r in reading.records] == [
        ("learner01", 1, True), ("learner02", 1, False), ("learner01", 2, False)]
    assert [c.key for c in view.columns] == ["horovod/1", "horovod/2"]
    assert view.cell("learner01", view.columns[0]).passed and view.stuck_at("learner02").key == "horovod/1"
    named = [p for p in reading.problems if "learner01.jsonl line 2" in p]
    assert len(reading.problems) == 1 and len(named) == 1, reading.problems
    assert why in named[0], named[0]
    assert "learner01.jsonl line 2" in text and "learner01.jsonl line 2" in page and "Skipped records" in page
    return view


def _status(tmp_path: Path, folder: Path, capsys: pytest.CaptureFixture[str], *more: str) -> tuple[str, str]:
    """``labkit class status --from FOLDER --html OUT [MORE]``: its exit status 0, and what it printed (out, err)."""
    parser = Parser(prog="labkit")
    classes_cli.add_cli(parser.add_subparsers(dest="subcommand", required=True))
    args = parser.parse_args(["class", "status", "--html", str(tmp_path / "view.html"), "--from", str(folder), *more])
    assert args.func(args) == 0
    said = capsys.readouterr()
    return said.out, said.err


def test_a_deeply_nested_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _shown(tmp_path, "[" * 4000, "nested")
    out, err = _status(tmp_path, _folder(tmp_path / "cli", "[" * 100_000), capsys)
    assert "learner01.jsonl line 2" in err and "learner02" in out


@pytest.mark.parametrize("deep", [
    '{"a": ' * 1100 + "1" + "}" * 1100,  # well formed, only too deep (and shorter than a line's cap)
    _line(extra="[" * 40 + "]" * 40),
    '"[[[[" ' + "{" * 5000,  # brackets inside a string do not count; outside they do
])
def test_nesting_is_refused_before_it_is_decoded(tmp_path: Path, deep: str) -> None:
    _shown(tmp_path, deep, "nested")


@pytest.mark.parametrize("when", ["1e300", "1e999", "-1", "-1e300", "1e11", "253402300800", "true", '"1764072000"',
                                  "[1764072000]"])
def test_a_time_out_of_range_is_named(tmp_path: Path, when: str) -> None:
    """1e300 once passed and broke the page's stamp; far future, negative, a boolean or text are no time either."""
    _shown(tmp_path, _line(time=when), "time is not a time")


@pytest.mark.parametrize(("field", "value", "why"), [
    ("step", "0", "step is not"), ("step", "1000", "step is not"), ("step", "-3", "step is not"),
    ("step", "true", "step is not"), ("step", "3.0", "step is not"), ("step", "1e2", "step is not"),
    ("passed", "1", "passed is not"), ("passed", "0", "passed is not"), ("passed", "null", "passed is not"),
    ("lab", '"horovod\\n"', "lab is not"), ("lab", '"horovod\\u202e"', "lab is not"), ("lab", "7", "lab is not"),
])
def test_every_field_is_range_checked(tmp_path: Path, field: str, value: str, why: str) -> None:
    _shown(tmp_path, _line(**{field: value}), why)


@pytest.mark.parametrize(("line", "why"), [
    (_line(time="NaN"), "time is not a time"),
    (_line(time="Infinity"), "time is not a time"),
    (_line(time="-Infinity"), "time is not a time"),
    (_line(step="NaN"), "step is not"),
    (_line(extra="NaN"), "NaN or Infinity"),  # json's constants are no numbers anywhere in a record
    (_line(extra="-Infinity"), "NaN or Infinity"),
])
def test_nan_and_infinity_are_refused(tmp_path: Path, line: str, why: str) -> None:
    _shown(tmp_path, line, why)


@pytest.mark.parametrize(("line", "why"), [
    (_line(time="1" + "0" * 400), "time is not a time"),  # past a float: once an OverflowError out of the view
    (_line(time="1" + "0" * 5000), "time is not a time"),  # past Python's int-digit limit
    (_line(step="9" * 5000), "step is not"),
    (_line(time=str(10**300)), "time is not a time"),
    (_line(extra="1" + "0" * 4400), "number"),
])
def test_a_huge_number_is_named(tmp_path: Path, line: str, why: str) -> None:
    _shown(tmp_path, line, why)


def test_a_huge_line_is_named_without_being_decoded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _shown(tmp_path, _line(message=json.dumps("x" * 100_000)), "longer than")
    _shown(tmp_path / "spaces", " " * 50_000 + _line() + " " * 50_000, "longer than")
    out, err = _status(tmp_path, _folder(tmp_path / "cli", "1" * 1_500_000), capsys)
    assert "learner01.jsonl line 2" in err and len(err) < 2000


def test_many_bad_lines_are_counted_not_each_listed(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "not json")
    with (folder / "learner01.jsonl").open("a") as f:
        f.write("not json\n" * 20_000)
    reading = classlog.read(folder, by_owner=False)
    assert len(reading.records) == 3 and len(reading.problems) <= 25
    assert "learner01.jsonl: 20001 lines skipped in all" in reading.problems[-1], reading.problems[-1]


@pytest.mark.parametrize(("bad", "why"), [
    (b'{"lab": "horovod", "step": 3, "passed": true, "message": "\xff\xfe\xc3", "time": 1.0}', "not UTF-8"),
    (b"\xff" * 20, "not UTF-8"),
    (_line(message='"\\ud800 a lone surrogate"').encode(), "message is not UTF-8 text"),
    (b'{"lab": "horovod", "step": 3, "passed": true, "message": "caf\xc3\xa9\xed\xa0\x80", "time": 1.0}', "not UTF-8"),
])
def test_bytes_that_are_not_utf8_are_named(tmp_path: Path, bad: bytes, why: str) -> None:
    _shown(tmp_path, bad, why)


def test_a_separator_inside_a_message_does_not_split_its_line(tmp_path: Path) -> None:
    """Only ``\\n`` ends a line: U+2028, U+0085 or a form feed inside a message (written raw) keep it whole."""
    folder = tmp_path / "class"
    folder.mkdir()
    row = {**GOOD[1], "message": "one\u2028two\x85three\x0cfour\x1cfive"}
    (folder / "learner01.jsonl").write_text(json.dumps(GOOD[0]) + "\n" + json.dumps(row, ensure_ascii=False) + "\n")
    reading = classlog.read(folder, by_owner=False)
    assert not reading.problems and [r.step for r in reading.records] == [1, 2]


@pytest.mark.parametrize("bad", ['"just some text"', "[1, 2, 3]", "1764072000", "null", "true", "{", "]",
                                 '{"lab": "horovod"} {"lab": "horovod"}'])
def test_a_line_that_is_not_an_object_is_named(tmp_path: Path, bad: str) -> None:
    _shown(tmp_path, bad, "learner01.jsonl line 2:")


def test_escapes_in_learners_text_never_reach_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Messages, learners' names (file names), lab names of grade results and skipped lines, in every line printed."""
    folder = tmp_path / "class"
    folder.mkdir()
    evil = "\x1b[2J\x1b]0;owned\x07\x9b31m \u202eevil\u2066 \r\x00 \u2028next"
    rows = [GOOD[0], {**GOOD[1], "message": evil}, {**GOOD[1], "learner": "x\x1b[31m\u202e", "step": 3}]
    (folder / "learner01.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    (folder / "learner\x1b[5m02.jsonl").write_text(json.dumps({**OTHER, "message": evil}) + "\n")
    (folder / "carol\u202e.json").write_text(json.dumps({"cases": [
        {"lab": "lab\x1b]0;x\x07", "step": 1, "passed": False, "message": evil}]}))
    (folder / "dave\x1b[1m.json").write_text("{not json " + evil)
    out, err = _status(tmp_path, folder, capsys)
    for shown in (out, err):
        assert not [c for c in ESCAPES if c in shown], [c for c in ESCAPES if c in shown]
    assert "learner01" in out and "\\x1b[2J" in out and "\\u202e" in out  # shown, not obeyed
    assert "learner01.jsonl line 3: names another learner" in err and "dave\\x1b[1m.json" in err
    out, err = _status(tmp_path, folder, capsys, "--json")
    assert not [c for c in ESCAPES if c in out + err] and json.loads(out)["steps"]
    text = classview.build(classlog.read(folder, by_owner=False).records).text()
    assert not [c for c in ESCAPES if c in text]
    page = (tmp_path / "view.html").read_text()  # HTML, escaped for a browser (control characters are inert there)
    assert "learner01" in page and "<script" not in page


def test_text_for_a_terminal_shows_what_it_would_obey() -> None:
    assert boundedjson.for_terminal("plain text, caf\u00e9, \u65e5\u672c, \U0001f600") == \
        "plain text, caf\u00e9, \u65e5\u672c, \U0001f600"
    shown = boundedjson.for_terminal("a\x1b[31mb\x07\x9b\u202e\u2066\u200b\u2028\r\n\t\x00\x7f\ud800z")
    assert shown == "a\\x1b[31mb\\x07\\x9b\\u202e\\u2066\\u200b\\u2028\\r\\n\\t\\x00\\x7f\\ud800z"
    assert shown.isprintable() and boundedjson.for_terminal(shown) == shown


def test_the_page_escapes_learners_html(tmp_path: Path) -> None:
    hostile = "<script>alert(1)</script>' onmouseover='alert(2)\""
    view = _shown(tmp_path, "not json", "learner01.jsonl line 2:")
    folder = _folder(tmp_path / "html", "x")
    with (folder / "learner01.jsonl").open("a") as f:
        f.write(json.dumps({**GOOD[1], "step": 4, "message": hostile}) + "\n")
    reading = classlog.read(folder, by_owner=False)
    page = classpage.html_page(classview.build(reading.records, view.learners, [*reading.problems, hostile]))
    assert "<script" not in page and "onmouseover='" not in page and "&lt;script&gt;" in page


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Stop the block after ``seconds`` (a quadratic build would run for minutes) where a timer signal can."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(*_: object) -> None:
        raise TimeoutError(f"the view took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_the_view_of_100k_records_is_built_in_linear_time() -> None:
    rows = [classlog.Record(f"learner{i % 1000:04d}", "horovod", 1 + i // 1000 % 8, i // 1000 % 3 != 0,
                            f"message {i % 7}", T0 + i) for i in range(100_000)]
    start = time.perf_counter()
    with _deadline(5.0):
        view = classview.build(rows)
        view.text()
        view.to_dict()
    took = time.perf_counter() - start
    assert len(view.learners) == 1000 and [c.step for c in view.columns] == list(range(1, 9))
    assert view.cell("learner0007", view.columns[0]).attempts == 13 and view.columns[1].minutes is not None
    assert took < 1.5, f"{took:.2f} s for 100k records"


def test_thousands_of_made_up_steps_are_capped(tmp_path: Path) -> None:
    """A learner can name any lab: the course's steps are always columns, made-up ones only up to a cap."""
    rows = [classlog.Record("learner01", f"fake{i}", 1 + i % 999, False, "x", T0 + i) for i in range(10_000)]
    rows.append(classlog.Record("learner02", "horovod", 1, True, "", T0))
    with _deadline(5.0):
        view = classview.build(rows, ["learner01", "learner02"])
        view.text()
    assert len(view.columns) <= classview.MAX_COLUMNS and view.columns[0].key == "horovod/1"
    assert any("not shown" in p for p in view.problems)


def _reference(rows: list[classlog.Record], lab: str, step: int) -> tuple[list[tuple[str, int]], float | None]:
    """A column's common failures and median minutes, computed the plain (quadratic) way."""
    seen = {(r.learner, classview.first_line(r.message)) for r in rows if r.lab == lab and r.step == step
            and not r.passed}
    failures = sorted(Counter(m for _, m in seen).items(), key=lambda mn: (-mn[1], mn[0]))[:classview.TOP_FAILURES]
    spans = []
    for who in {r.learner for r in rows}:
        mine = [(r, r.time) for r in rows if r.learner == who and r.lab == lab and r.time is not None]
        passed = [t for r, t in mine if r.step == step and r.passed]
        before = [t for r, t in mine if r.step == step - 1 and r.passed] if step > 1 else [t for _, t in mine]
        if passed and before:
            spans.append(max(0.0, min(passed) - min(before)) / 60)
    return failures, statistics.median(spans) if spans else None


def test_the_linear_view_counts_as_the_plain_one() -> None:
    rng = random.Random(7)
    rows = sorted((classlog.Record(f"l{rng.randrange(12)}", rng.choice(["horovod", "mirrored", "assessment"]),
                                   rng.randrange(1, 5), rng.random() < 0.5, rng.choice(["a\nb", "b", " c", "a"]),
                                   rng.choice([None, T0 + rng.randrange(5000)])) for _ in range(600)),
                  key=lambda r: r.time or 0.0)
    view = classview.build(rows)
    for col in view.columns:
        failures, minutes = _reference(rows, col.lab, col.step)
        assert col.failures == failures, col.key
        assert (col.minutes is None and minutes is None) or col.minutes == pytest.approx(minutes), col.key
        latest = [view.cell(w, col) for w in view.learners if view.cell(w, col) is not None]
        assert col.tried == len(latest) and col.passed == sum(x.passed for x in latest)
