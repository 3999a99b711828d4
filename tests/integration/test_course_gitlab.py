"""The released course's GitLab pipeline, run with ``gitlab-ci-local`` in a fresh minimal machine.

``labkit release`` makes a course repository with two learners' commits on it: every lab finished, and the
Horovod script stopped after step 2 (:mod:`helpers.course_repo`). A fresh minimal Debian container (Debian's
``python3``, ``python3-venv``, ``g++``, ``make`` and ``git``; root, as the job's ``python:3.11-bookworm`` image
runs it) clones the course and, for each commit, checks it out clean (what is not
in the repository removed, except the job's cache folder ``.cache/labkit``, kept as GitLab's cache restores it)
and runs the ``grade`` job of ``.gitlab-ci.yml`` with ``gitlab-ci-local --force-shell-executor``: the job's
``script`` in order, in the project folder, then its artifacts. The test reads the job's exit status, the JUnit
report and ``grade.json`` from the artifacts, and the job's log.

gitlab-ci-local comes from the npm registry (pinned: 4.74 and later need Node 22) and runs on this machine's
Node.js, lent read-only (it needs Node 20; Debian 12 has 18): both are the harness, not the course. pip
and apt in the container reach only the package index and the Debian mirror, with this machine's settings lent
to it read-only (tests/helpers/podman.py). Everything lives in a podman store of the test's own, emptied and
removed on exit, error or interrupt, and the test asserts it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from helpers import course_repo, paths
from helpers.podman import HOST_PIP, Store, fresh_debian, lent_pip, skip_unless_served

from labkit.deploy.image import build

ROOT = paths.ROOT
PACKAGES = ("python3", "python3-venv", "g++", "make", "git", "ca-certificates", "rsync")  # rsync: gitlab-ci-local's
GITLAB_CI_LOCAL = "4.73.0"
JOB = "grade"

SCRIPT = f"""set -u
cd /root
git config --global --add safe.directory '*'
git clone -q /in/course.git course && cd course
for commit in $(cat /in/commits); do
  name="${{commit%%:*}}"; sha="${{commit#*:}}"
  git checkout -q "$sha" && git clean -q -xdf -e .cache/
  [ -d .cache/labkit ] && echo "cache restored" || echo "cache missed"
  node /in/gcl/node_modules/gitlab-ci-local/dist/index.js --force-shell-executor {JOB} > "/out/$name.log" 2>&1
  echo "$name exit $?" | tee -a /out/codes
  mkdir -p "/out/$name" && cp -a .gitlab-ci-local/artifacts/{JOB}/. "/out/$name/" 2>/dev/null || true
done
echo all-commits-done
"""


def test_the_pipeline_has_one_grading_job_with_a_junit_report() -> None:
    pipeline = yaml.safe_load((ROOT / "course" / "workflows" / "gitlab-ci.yml").read_text())
    job = pipeline[JOB]
    assert job["artifacts"]["reports"]["junit"] == "grade.xml" and job["artifacts"]["when"] == "always"
    assert any("labkit grade" in line and line.lstrip().startswith("env -i") for line in job["script"])
    assert job["cache"]["paths"] == [".cache/labkit/"]


def _gitlab_ci_local(folder: Path) -> Path:
    """gitlab-ci-local and what it needs, installed from the npm registry into ``folder``; this machine's
    Node.js (20 or later), to be lent to the container."""
    node = shutil.which("node")
    if shutil.which("npm") is None or node is None:
        pytest.skip("needs Node.js and npm")
    major = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    if not major.startswith("v") or int(major[1:].split(".")[0]) < 20:
        pytest.skip(f"gitlab-ci-local {GITLAB_CI_LOCAL} needs Node.js 20 or later (here {major})")
    out = subprocess.run(["npm", "install", "--quiet", "--no-audit", "--no-fund", "--prefix", str(folder),
                          f"gitlab-ci-local@{GITLAB_CI_LOCAL}"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.skip(f"gitlab-ci-local could not be had from the npm registry: {out.stderr[-500:]}")
    return Path(node).resolve()


@pytest.mark.slow
@pytest.mark.heavy  # a fresh machine, make setup twice (one Horovod build) and two gradings: make test-heavy
def test_the_released_pipeline_grades_finished_and_broken_commits(tmp_path: Path) -> None:
    lacking = build.missing_tools()
    if lacking:
        pytest.skip("needs " + ", ".join(lacking))
    skip_unless_served()
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    outbox.mkdir()
    node = _gitlab_ci_local(inbox / "gcl")
    bare, commits = course_repo.with_commits(tmp_path)
    shutil.copytree(bare, inbox / "course.git")
    (inbox / "commits").write_text(" ".join(f"{k}:{v}" for k, v in commits.items()) + "\n")
    (inbox / "run.sh").write_text(SCRIPT)
    tag = f"localhost/labkit-course-gitlab-test:{uuid.uuid4().hex[:8]}"
    name = f"labkit-test-course-gitlab-{uuid.uuid4().hex[:8]}"
    store = Store(Path(tempfile.mkdtemp(prefix="labkit-course-gitlab-podman-")))
    lent = tmp_path / "lent"
    lent.mkdir()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        fresh_debian(store, tmp_path, PACKAGES, tag)
        run = store.run("run", "--name", name, "-w", "/root", *lent_pip(lent, HOST_PIP.read_text()),
                        "-v", f"{node}:/usr/local/bin/node:ro",
                        "-v", f"{inbox}:/in:ro", "-v", f"{outbox}:/out", tag, "bash", "/in/run.sh",
                        timeout=5400, check=False)
        log = run.stdout + run.stderr
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        (ROOT / "test-artifacts" / "course-gitlab.log").write_text(log)
        for f in outbox.glob("*.log"):
            shutil.copy2(f, ROOT / "test-artifacts" / f"course-gitlab.{f.name}")
        assert "all-commits-done" in log, log[-5000:]
        assert [line.split()[0] for line in log.splitlines() if line.startswith("cache ")] == \
            ["cache", "cache"] and "cache missed" in log and "cache restored" in log, log[-3000:]
        jobs = {n: (outbox / f"{n}.log").read_text() for n in commits}
        assert "no cached wheel" in jobs["finished"] and "using cached wheel" in jobs["broken"]
        codes = dict(line.split(" exit ") for line in (outbox / "codes").read_text().splitlines())
        top = None
        for n in commits:
            saved = json.loads((outbox / n / "grade.json").read_text())
            suite = ET.parse(outbox / n / "grade.xml").getroot()
            failures = sum(int(s.get("failures", "0")) for s in suite.iter("testsuite"))
            cases = sum(int(s.get("tests", "0")) for s in suite.iter("testsuite"))
            assert (outbox / n / "summary.md").read_text().strip(), n
            top = saved["max_score"]
            assert cases == len(saved["cases"]), (n, cases)
            if n == "finished":
                assert codes[n] == "0" and saved["score"] == top and failures == 0, (n, codes, jobs[n][-3000:])
            else:
                failing = [f"{c['lab']} step {c['step']}" for c in saved["cases"] if not c["passed"]]
                assert codes[n] != "0" and "FAIL" in jobs[n], (n, codes)
                assert failing == [*[f"horovod step {k}" for k in range(3, 9)], "communication step 1"], failing
                assert failures == len(failing) and 0 < saved["score"] < top, (failures, saved["score"])
        print(f"\ngitlab-ci-local {GITLAB_CI_LOCAL}: finished {top:g}/{top:g}, broken "
              f"{json.loads((outbox / 'broken' / 'grade.json').read_text())['score']:g}/{top:g}")
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.empty()
        assert store.left() == [], f"the test left its podman store or its mounts: {store.left()}"
