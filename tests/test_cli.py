"""Every command answers bad arguments with a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from labkit import cli

BAD = {
    "run --np 0 -- true": "must be at least 1",
    "run --np x -- true": "is not a whole number",
    "run --timeout -1 -- true": "must be more than 0",
    "run --threads 0 -- true": "must be at least 1",
    "run --hosts bad:: -- true": "IPv6",
    "run --launcher nope -- true": "invalid choice",
    "cluster --workers 0 -- true": "must be at least 1",
    "cluster --ps -1 -- true": "must be 0 or more",
    "bench nope.py": "not found",
    "bench x.py --np 0": "bad worker counts",
    "bench x.py --target 82": "between 0 and 1",
    "check horovod nope.py": "no such script",
    "check horovod nope.py --step 0": "must be at least 1",
    "check nolab x.py": "invalid choice",
    "grade /nonexistent": "is not a folder",
    "grade labs --min-score -3": "must be 0 or more",
    "k8s mpijob --workers 0": "must be at least 1",
    "reset nope.py": "is not a lab starter",
    "release": "required",
    "plot /nonexistent": "no records",
    "doctor --bogus": "unrecognized arguments: --bogus",
    "data --nope": "unrecognized arguments: --nope",
    "gen extra": "unrecognized arguments: extra",
    "nocommand": "invalid choice",
}


@pytest.mark.parametrize("line", list(BAD))
def test_bad_arguments_get_a_message_not_a_traceback(line: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli.main(line.split())
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code not in (0, None), err
    assert BAD[line] in err, err
    assert "Traceback" not in err


def test_an_unexpected_error_is_one_line_unless_asked(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit import doctor

    def broken(as_json: bool = False) -> int:
        raise RuntimeError("something broke")

    monkeypatch.setattr(doctor, "main", broken)
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert "labkit doctor: RuntimeError: something broke" in err and "--traceback" in err
    with pytest.raises(RuntimeError):
        cli.main(["--traceback", "doctor"])
