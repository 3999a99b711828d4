"""The CI files `labkit release` writes into a course: the GitHub workflow (zizmor finds nothing at medium or
above; valid against the GitHub workflow schema; pinned, read-only, the checks run without the token) and the
GitLab pipeline (valid against GitLab's schema; the JUnit report). Offline: both checkers' schemas are vendored."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labkit.course import release as course

BIN = Path(sys.executable).parent
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def _tool(name: str) -> str:
    path = BIN / name
    if not path.is_file():
        pytest.fail(f"{name} is not installed in {BIN}: it is in the test extra (pip install -e '.[test]')")
    return str(path)


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "course"
    files = course.release_files()
    for rel in (".github/workflows/grade.yml", ".gitlab-ci.yml"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(files[rel])
    return out


def _workflow(released: Path) -> dict:
    return yaml.safe_load((released / ".github" / "workflows" / "grade.yml").read_text())


def test_zizmor_finds_nothing_at_medium_or_above(released: Path) -> None:
    workflow = released / ".github" / "workflows" / "grade.yml"
    for persona in ("regular", "auditor"):
        done = subprocess.run([_tool("zizmor"), "--offline", "--no-config", f"--persona={persona}", "--format=json",
                               str(workflow)], capture_output=True, text=True, timeout=120)
        findings = json.loads(done.stdout)
        serious = [f"{f['ident']}: {f['desc']}" for f in findings
                   if f["determinations"]["severity"] in ("Medium", "High")]
        assert serious == [], serious
        assert persona != "regular" or findings == [], findings


def test_zizmor_still_flags_what_it_did_before(tmp_path: Path) -> None:
    """The audit is live: the retired workflow's unpinned `uses:` and persisted credentials are found."""
    old = tmp_path / ".github" / "workflows" / "grade.yml"
    old.parent.mkdir(parents=True)
    old.write_text("name: grade\non: push\npermissions:\n  contents: read\njobs:\n  grade:\n    runs-on: ubuntu-24.04\n"
                   "    steps:\n      - uses: actions/checkout@v4\n      - run: make setup\n")
    done = subprocess.run([_tool("zizmor"), "--offline", "--no-config", "--format=json", str(old)],
                          capture_output=True, text=True, timeout=120)
    assert {f["ident"] for f in json.loads(done.stdout)} >= {"unpinned-uses", "artipacked"}


@pytest.mark.slow  # check-jsonschema builds its schema parser: seconds, out of make test-fast
@pytest.mark.parametrize(("rel", "schema"), [(".github/workflows/grade.yml", "vendor.github-workflows"),
                                             (".gitlab-ci.yml", "vendor.gitlab-ci")])
def test_valid_against_the_ci_schema(released: Path, tmp_path: Path, rel: str, schema: str) -> None:
    check = [_tool("check-jsonschema"), "--builtin-schema", schema]
    done = subprocess.run([*check, str(released / rel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / Path(rel).name  # the checker rejects a broken file: the schema is really applied
    data = yaml.safe_load((released / rel).read_text())
    if schema == "vendor.github-workflows":
        del data["jobs"]["grade"]["runs-on"]
    else:
        data["grade"]["artifacts"]["reports"]["junit"] = 5
    broken.write_text(yaml.safe_dump(data))
    assert subprocess.run([*check, str(broken)], capture_output=True, text=True, timeout=120).returncode == 1


def test_workflow_is_pinned_read_only_and_grades_without_the_token(released: Path) -> None:
    text = (released / ".github" / "workflows" / "grade.yml").read_text()
    wf = _workflow(released)
    assert wf["permissions"] == {"contents": "read"}
    assert not re.search(r":\s*write\b", text) and "classroom" not in text.lower()  # no write anywhere
    job = wf["jobs"]["grade"]
    assert "permissions" not in job
    assert set(job["outputs"]) == {"score", "max_score"}
    uses = [s for s in job["steps"] if "uses" in s]
    assert {s["uses"].split("@")[0] for s in uses} == {"actions/checkout", "actions/cache", "actions/upload-artifact"}
    for step in uses:
        assert SHA_PIN.match(step["uses"]), step["uses"]
        assert re.search(re.escape(step["uses"]) + r" # v\d+\.\d+\.\d+$", text, re.M), step["uses"]
        if step["uses"].startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False
    runs = {s.get("id"): s["run"] for s in job["steps"] if "run" in s}
    assert "env -i HOME=" in runs["grade"] and "--save" in runs["grade"]  # the checks: no token, no runner files
    checks = runs["grade"].split("env -i", 1)[1].split("|| status=$?", 1)
    assert "GITHUB_" not in checks[0]
    emptied = re.search(r'for written in (.*); do\n\s*if \[ -n "\$written" \]; then : > "\$written"; fi', checks[1])
    assert emptied and set(emptied[1].split()) == {f'"$GITHUB_{n}"' for n in ("ENV", "PATH", "OUTPUT", "STEP_SUMMARY",
                                                                             "STATE")}
    assert checks[1].rstrip().endswith('exit "$status"')  # after the runner's files are emptied, the checks' status
    assert "--report" in runs["report"] and "$GITHUB_STEP_SUMMARY" in runs["report"]


def test_gitlab_job_reports_junit_and_keeps_the_summary(released: Path) -> None:
    ci = yaml.safe_load((released / ".gitlab-ci.yml").read_text())
    job = ci["grade"]
    assert job["image"].startswith("python:3.11-bookworm")
    assert job["artifacts"]["reports"]["junit"] == "grade.xml" and "summary.md" in job["artifacts"]["paths"]
    assert job["artifacts"]["when"] == "always"
    assert job["cache"]["key"]["files"] == ["scripts/setup.sh", "pyproject.toml"]
    assert job["script"][:2] == ['export LABKIT_CACHE="$PWD/.cache/labkit"', "make setup"]  # the cache's folder
    assert ".venv/bin/labkit grade --junit grade.xml --summary summary.md" in job["script"][2]
    assert job["script"][2].startswith("env -i ")  # the checks run without CI_JOB_TOKEN


def test_the_workflow_keys_its_cache_on_the_grader_files_that_exist(released: Path) -> None:
    key = next(s for s in _workflow(released)["jobs"]["grade"]["steps"] if s.get("name", "").startswith("Cache"))
    for path in re.findall(r"'grader/([^'*]+)'", key["with"]["key"]):
        assert (course.labs.ROOT / path).exists(), path
