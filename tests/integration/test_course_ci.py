"""The released course's GitHub workflow, run as a runner runs it, in a fresh minimal machine.

``labkit release`` makes a course repository; three learners' commits are made on it: every lab finished, the
Horovod script stopped after step 2 (broken), and that broken script again with code that tries to raise its own
grade (hostile). A fresh minimal Debian container (``python3``, ``python3-venv``, ``g++``, ``make``, ``git``,
``sudo``; a ``runner`` user with passwordless ``sudo``, as on GitHub's hosted runners) then runs, for each
commit, what the workflow's YAML says, in its order: the two checkouts (``submission/`` and ``grader/``, the
commit being graded, as ``GRADER_REPOSITORY: ""`` asks), the cache step (its ``path``, restored and saved under
its ``key``, computed from the files its ``hashFiles`` names), then every ``run:`` step in its working directory
with the runner's variables (``GITHUB_WORKSPACE``, ``RUNNER_TEMP``, ``GITHUB_OUTPUT`` and
``GITHUB_STEP_SUMMARY`` in ``RUNNER_TEMP/_runner_file_commands``, as the runner keeps them). The test reads the
job's outputs, the JUnit report, the summary and the exit codes.

The runner's file commands are kept as a hosted runner keeps them: for each step, empty files in
``RUNNER_TEMP/_runner_file_commands`` named by ``GITHUB_OUTPUT``, ``GITHUB_ENV``, ``GITHUB_PATH``, ``GITHUB_STATE`` and
``GITHUB_STEP_SUMMARY``, read when the step ends (what a step's ``GITHUB_ENV`` holds is in the environment of the
steps after it; its summary is on the job's page).

The hostile script writes to every file the runner's variables would name; finds the runner's file-command
folder and the grading's result folder where a hosted runner keeps them and writes there (``BASH_ENV`` for the
next step, pointing to a script that writes a score of 999; ``score=999`` lines); and leaves a process that
leaves its session and environment behind and waits to overwrite the result once the grading has written it.
Its grade must be the broken script's, and no 999 may reach the job's outputs or its summary.

pip and apt in the container reach only the package index and the Debian mirror, with this machine's settings
lent to it read-only (tests/helpers/podman.py); that stays in the test. Everything lives in a podman store of the
test's own, emptied and removed on exit, error or interrupt, and the test asserts it.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import tempfile
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from helpers import course_repo, paths
from helpers.podman import HOST_PIP, LENT_CA, Store, fresh_debian, lent_pip, skip_unless_served

from labkit.course import labs
from labkit.deploy.image import build
from labkit.instrument import data

ROOT = paths.ROOT
PACKAGES = ("python3", "python3-venv", "g++", "make", "git", "sudo", "ca-certificates")
RUNNER = "runner"
WORK = f"/home/{RUNNER}/work"  # a hosted runner's folders: the workspace and RUNNER_TEMP below it
TEMP = f"{WORK}/_temp"

# Module-level code prepended to a learner's script: it tries every way to the grade a learner's process has.
TAMPER = f'''import os as _os, glob as _glob, sys as _sys
open("/tmp/tamper-ran", "a").close()
for _var in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_ENV"):
    if _os.environ.get(_var):
        open(_os.environ[_var], "a").write("score=999\\n")
open("/tmp/evil.sh", "w").write("echo score=999 >> \\"$GITHUB_OUTPUT\\"\\n"
                                "echo labkit grade: 999 >> \\"$GITHUB_STEP_SUMMARY\\"\\n")
for _path in _glob.glob("{TEMP}/_runner_file_commands/*") + _glob.glob("{TEMP}/labkit-graded/*"):
    try:
        open(_path, "a").write("BASH_ENV=/tmp/evil.sh\\n" if "set_env" in _path else "score=999\\n")
    except OSError:
        pass
_LATER = """
import glob, json, os, time
open("/tmp/tamper-daemon-started", "a").close()
for _ in range(3000):
    open("/tmp/tamper-daemon-alive", "w").write(str(time.time()))
    for path in glob.glob("{TEMP}/labkit-graded/grade.json"):
        try:
            saved = json.load(open(path))
            if saved.get("score") != saved.get("max_score"):
                saved["score"] = saved["max_score"]
                for case in saved.get("cases", []):
                    case["passed"] = True
                json.dump(saved, open(path, "w"))
        except (OSError, ValueError):
            pass
    for path in glob.glob("{TEMP}/_runner_file_commands/*"):
        try:
            open(path, "a").write("score=999\\\\n")
        except OSError:
            pass
    time.sleep(0.1)
"""
if _os.fork() == 0:  # a process of its own session, with an empty environment: no job's mark, no parent's
    _os.setsid()
    if _os.fork() == 0:
        _os.execve(_sys.executable, [_sys.executable, "-c", _LATER], {{}})
    _os._exit(0)
'''

SCRIPT = f"""set -u
export HOME=/home/{RUNNER}
cd "$HOME"
git config --global --add safe.directory '*'  # as actions/checkout does: the repository is another user's
for commit in $(cat /in/commits); do
  name="${{commit%%:*}}"; sha="${{commit#*:}}"
  echo "=== $name $sha"
  rm -rf {WORK} && mkdir -p {WORK}/course {TEMP}/_runner_file_commands
  cd {WORK}/course
  for where in submission grader; do
    git clone -q /in/course.git "$where" && git -C "$where" checkout -q "$sha"
  done
  key="$(bash /in/cache_key.sh)"
  echo "cache key $key"
  if [ -d "/home/{RUNNER}/caches/$key" ]; then rm -rf {{cache_path}}; mkdir -p "$(dirname {{cache_path}})"; \
cp -a "/home/{RUNNER}/caches/$key" {{cache_path}}; echo "cache restored"; else echo "cache missed"; fi
  codes=""
  added=()  # what the steps' GITHUB_ENV files set, for the steps after them (KEY=VALUE lines)
  for step in /in/steps/*.sh; do
    id="$(basename "$step" .sh)"; id="${{id#*-}}"
    dir="$(cat "/in/steps/$id.dir" 2>/dev/null || echo .)"
    files={TEMP}/_runner_file_commands
    for kind in set_output set_env add_path save_state step_summary; do : > "$files/${{kind}}_$id"; done
    (cd "$dir" && env -i HOME="$HOME" PATH="/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 \\
       LABKIT_DATA=/in/data PIP_CERT="$PIP_CERT" GITHUB_ACTIONS=true GITHUB_WORKSPACE={WORK}/course \\
       RUNNER_TEMP={TEMP} GITHUB_OUTPUT="$files/set_output_$id" GITHUB_ENV="$files/set_env_$id" \\
       GITHUB_PATH="$files/add_path_$id" GITHUB_STATE="$files/save_state_$id" \\
       GITHUB_STEP_SUMMARY="$files/step_summary_$id" "${{added[@]}}" \\
       bash --noprofile --norc -eo pipefail "$step") > "/out/$name.$id.log" 2>&1
    code=$?
    mkdir -p "/out/$name"  # what the runner reads of the step's files, when it reads them: as the step ends
    for kind in set_output set_env add_path save_state step_summary; do cp "$files/${{kind}}_$id" "/out/$name/"; done
    echo "step $id exit $code"
    codes="$codes $id=$code"
    while IFS= read -r line; do case "$line" in *=*) added+=("$line");; esac; done < "$files/set_env_$id"
    if [ "$id" = setup ] && [ $code -ne 0 ]; then break; fi
  done
  sleep 5  # what the learner's code left running would act now
  if [ -e /tmp/tamper-daemon-alive ]; then echo "$(date +%s) $(cat /tmp/tamper-daemon-alive)" > "/out/$name.alive"; fi
  ls /tmp/tamper-ran /tmp/tamper-daemon-started > "/out/$name.tampered" 2>/dev/null
  rm -f /tmp/tamper-*
  if [ ! -d "/home/{RUNNER}/caches/$key" ] && [ -d {{cache_path}} ]; then \
mkdir -p /home/{RUNNER}/caches && cp -a {{cache_path}} "/home/{RUNNER}/caches/$key"; fi
  mkdir -p "/out/$name"
  cp -a {TEMP}/labkit-graded/. "/out/$name/" 2>/dev/null || true
  echo "$codes" > "/out/$name/codes"
  cd "$HOME"
done
echo "all-commits-done"
"""


def _workflow() -> dict:
    return yaml.safe_load((ROOT / "course" / "workflows" / "grade.yml").read_text())


def steps_to_run(workflow: dict) -> tuple[list[tuple[str, str, str]], str, list[str]]:
    """The job's ``run:`` steps as (id, working directory, script), in order; the cache's path and the files its key
    hashes. A step without an id is named by its place."""
    steps = workflow["jobs"]["grade"]["steps"]
    cache = next(s for s in steps if str(s.get("uses", "")).startswith("actions/cache@"))
    key = cache["with"]["key"]
    globs = re.findall(r"'([^']+)'", re.search(r"hashFiles\(([^)]*)\)", key)[1])
    runs = []
    for i, s in enumerate(steps):
        if "run" in s:
            runs.append((s.get("id") or ("setup" if s["run"].strip() == "make setup" else f"step{i}"),
                         s.get("working-directory", "."), s["run"]))
    return runs, cache["with"]["path"], globs


def test_the_workflow_is_read_in_its_order_with_its_cache() -> None:
    runs, path, globs = steps_to_run(_workflow())
    assert [r[0] for r in runs] == ["setup", "grade", "report"]
    assert runs[0][1] == "grader" and path == "~/.cache/labkit"
    assert globs == ["grader/patches/**", "grader/scripts/setup.sh", "grader/pyproject.toml"]
    compile(TAMPER, "tamper", "exec")
    compile(course_repo.run_first(TAMPER, labs.get("horovod").solution(2).read_text()), "hostile", "exec")


def _cache_key_script(globs: list[str]) -> str:
    """A cache key made as ``hashFiles`` makes one (the hash of the files' hashes, in path order), in the container:
    the same grader files give the same key, a changed one another. Not GitHub's own string, which is not needed."""
    finds = " ".join(f"'{g.replace('/**', '')}'" for g in globs)
    return (f"cd {WORK}/course && find {finds} -type f 2>/dev/null | LC_ALL=C sort | xargs sha256sum "
            "| cut -d' ' -f1 | sha256sum | cut -c1-64 | sed 's/^/labkit-Linux-/'\n")


def _outputs(folder: Path) -> dict[str, list[str]]:
    """The job's outputs: every ``key=value`` line of the report step's output file (the job's ``outputs`` are
    ``steps.report.outputs``), by key (a key set twice shows twice)."""
    out: dict[str, list[str]] = {}
    for f in [folder / "set_output_report"]:
        for line in f.read_text().splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                out.setdefault(key, []).append(value)
    return out


@pytest.mark.slow
@pytest.mark.heavy  # a fresh machine, make setup three times (one Horovod build) and three gradings: make test-heavy
def test_the_released_workflow_grades_finished_broken_and_hostile_commits(tmp_path: Path) -> None:
    lacking = build.missing_tools()
    if lacking:
        pytest.skip("needs " + ", ".join(lacking))
    skip_unless_served()
    found = data.find()
    if found is None:
        pytest.skip("Fashion-MNIST is not on this machine (LABKIT_DATA)")
    runs, cache_path, globs = steps_to_run(_workflow())
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    (inbox / "steps").mkdir(parents=True)
    outbox.mkdir()
    outbox.chmod(0o777)
    shutil.copytree(found, inbox / "data")
    bare, commits = course_repo.with_commits(tmp_path, TAMPER)
    shutil.copytree(bare, inbox / "course.git")
    (inbox / "commits").write_text(" ".join(f"{k}:{v}" for k, v in commits.items()) + "\n")
    for i, (step_id, where, text) in enumerate(runs):
        (inbox / "steps" / f"{i}-{step_id}.sh").write_text(text)
        (inbox / "steps" / f"{step_id}.dir").write_text(f"{WORK}/course/{where}" if where != "." else f"{WORK}/course")
    (inbox / "cache_key.sh").write_text(_cache_key_script(globs))
    home_cache = cache_path.replace("~", f"/home/{RUNNER}")
    (inbox / "run.sh").write_text(SCRIPT.replace("{cache_path}", home_cache))
    tag = f"localhost/labkit-course-ci-test:{uuid.uuid4().hex[:8]}"
    name = f"labkit-test-course-ci-{uuid.uuid4().hex[:8]}"
    store = Store(Path(tempfile.mkdtemp(prefix="labkit-course-ci-podman-")))
    lent = tmp_path / "lent"
    lent.mkdir()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        fresh_debian(store, tmp_path, PACKAGES, tag, [
            f"chroot \"$1\" useradd -m -s /bin/bash {RUNNER}",
            f"echo '{RUNNER} ALL=(ALL) NOPASSWD:ALL' > \"$1/etc/sudoers.d/{RUNNER}\""])
        run = store.run("run", "--name", name, "--user", RUNNER, "-w", f"/home/{RUNNER}",
                        *lent_pip(lent, HOST_PIP.read_text()), "-e", f"PIP_CERT={LENT_CA}",
                        "-v", f"{inbox}:/in:ro", "-v", f"{outbox}:/out", tag, "bash", "/in/run.sh",
                        timeout=5400, check=False)
        log = run.stdout + run.stderr
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        (ROOT / "test-artifacts" / "course-ci.log").write_text(log)
        for f in outbox.glob("*.log"):
            shutil.copy2(f, ROOT / "test-artifacts" / f"course-ci.{f.name}")
        assert "all-commits-done" in log, log[-5000:]
        setup_logs = {n: (outbox / f"{n}.setup.log").read_text() for n in commits}
        # The cache: missed once (the wheel built), then restored under the same key and the wheel used.
        assert re.findall(r"cache (missed|restored)", log) == ["missed", "restored", "restored"], log[-3000:]
        assert "no cached wheel" in setup_logs["finished"]
        assert all("using cached wheel" in setup_logs[n] for n in ("broken", "hostile"))
        top = None
        for n in commits:
            codes = dict(c.split("=") for c in (outbox / n / "codes").read_text().split())
            assert codes["setup"] == "0" and codes["report"] == "0", (n, codes, setup_logs[n][-2000:])
            saved = json.loads((outbox / n / "grade.json").read_text())
            outputs = _outputs(outbox / n)
            suite = ET.parse(outbox / n / "grade.xml").getroot()
            failures = sum(int(s.get("failures", "0")) for s in suite.iter("testsuite"))
            summary = "".join(f.read_text() for f in sorted((outbox / n).glob("step_summary_*")))  # the job's page
            assert not any(f.read_text().strip() for f in (outbox / n).glob("set_env_*")), n  # nothing for later steps
            top = saved["max_score"]
            if n == "finished":
                assert codes["grade"] == "0" and saved["score"] == top and failures == 0, (n, codes, saved["score"])
            else:
                failing = [f"{c['lab']} step {c['step']}" for c in saved["cases"] if not c["passed"]]
                assert codes["grade"] == "1", (n, codes)
                assert failing == [*[f"horovod step {k}" for k in range(3, 9)], "communication step 1"], (n, failing)
                assert failures == len(failing)
            assert outputs == {"score": [f"{saved['score']:g}"], "max_score": [f"{top:g}"]}, (n, outputs)
            assert f"labkit grade: {saved['score']:g} / {top:g}" in summary, (n, summary[:300])
            assert not re.search(r"score=999|grade: 999", summary + "".join(outputs.get("score", []))), n
        # The hostile script did run its attack, and what it left running was stopped with its check.
        tampered = sorted((outbox / "hostile.tampered").read_text().split())
        assert tampered == ["/tmp/tamper-daemon-started", "/tmp/tamper-ran"], tampered
        now, last = (float(x) for x in (outbox / "hostile.alive").read_text().split())
        assert now - last > 4, f"the process the script left was still running {now - last:.1f} s before the end"
        assert not (outbox / "finished.tampered").read_text().strip()
        broken = json.loads((outbox / "broken" / "grade.json").read_text())
        hostile = json.loads((outbox / "hostile" / "grade.json").read_text())
        assert hostile["score"] == broken["score"] < top
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.empty()
        assert store.left() == [], f"the test left its podman store or its mounts: {store.left()}"
