"""A released course as a learner's repository, for the tests that run its CI: ``labkit release``, then the
learner's commits on it (every lab finished, the Horovod script stopped after step 2, and optionally that
script again with code of the test's own run first), cloned bare for a container to read."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import paths
from helpers.browser import final_solutions
from labkit.course import labs
from labkit.course import release as course


def commit(repo: Path, message: str) -> str:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, timeout=60)
    subprocess.run(["git", "-c", "user.name=learner", "-c", "user.email=learner@example.org", "commit", "-q",
                    "-m", message], cwd=repo, check=True, timeout=60)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


def with_commits(folder: Path, hostile: str | None = None) -> tuple[Path, dict[str, str]]:
    """The released course as a bare repository in ``folder`` and the learners' commits on it: name -> sha
    (``finished``, ``broken`` and, given ``hostile`` code, ``hostile``: the broken script with it run first,
    after its ``from __future__`` imports)."""
    repo = folder / "course"
    course.release(repo, root=paths.ROOT)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True, timeout=60)
    commit(repo, "the course as handed out")
    for starter, solution in final_solutions().items():
        (repo / "labs" / starter).write_bytes(solution.read_bytes())
    commits = {"finished": commit(repo, "every lab finished")}
    horovod = labs.get("horovod")
    broken = horovod.solution(2).read_text()
    (repo / "labs" / horovod.starter).write_text(broken)
    commits["broken"] = commit(repo, "the Horovod lab stopped after step 2")
    if hostile is not None:
        (repo / "labs" / horovod.starter).write_text(run_first(hostile, broken))
        commits["hostile"] = commit(repo, "the broken script, raising its own grade")
    bare = folder / "course.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True, timeout=120)
    return bare, commits


def run_first(code: str, script: str) -> str:
    """``script`` with ``code`` run first, after its ``from __future__`` imports (which must come first)."""
    lines = script.splitlines(keepends=True)
    at = max((i + 1 for i, line in enumerate(lines) if line.startswith("from __future__")), default=0)
    return "".join(lines[:at]) + code + "".join(lines[at:])
