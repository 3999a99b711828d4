"""Submit a batch script and wait for its job: the job's end seen within seconds, not half a minute.

    python -m labkit.launching.slurm_wait job.sbatch     # prints the job id; exits with the job's exit code

``sbatch --wait`` looks at its job after 2 s, 8 s more, then every 32 s while the cluster keeps
finished jobs listed (Slurm's ``MinJobAge``, 300 s by default): a short job's end shows up to
half a minute late. This submits with ``sbatch --parsable`` and asks ``scontrol show job`` at
intervals that start at 0.5 s and grow to 3 s (a light load on the controller even for many
learners), then exits like ``sbatch --wait``: with the job's exit code, 128 + the signal that
ended it, or 1 when Slurm ended it (time limit, node failure) without one. Stopped by Ctrl-C or
SIGTERM, it cancels the job (``scancel``) before it exits.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

FIRST, GROWTH, MOST = 0.5, 1.5, 3.0
# Job states after which a job never runs again (scontrol's names).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}
_ID = re.compile(r"^(\d+)(?:;\S+)?\s*$", re.M)


class SubmitError(RuntimeError):
    """sbatch refused the script; the message is sbatch's."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def parse_job_id(output: str) -> str | None:
    """The job id ``sbatch --parsable`` printed (``N`` or ``N;cluster`` on a line of its own)."""
    m = _ID.search(output)
    return m.group(1) if m else None


def submit(script: str, sbatch: str = "sbatch") -> str:
    """Submit ``script`` and return the job id."""
    out = subprocess.run([sbatch, "--parsable", script], capture_output=True, text=True, timeout=120)
    job_id = parse_job_id(out.stdout)
    if out.returncode != 0 or not job_id:
        raise SubmitError((out.stderr or out.stdout).strip() or f"sbatch exited with {out.returncode}",
                          out.returncode or 1)
    return job_id


def parse_job(text: str) -> tuple[str, int, int] | None:
    """``(state, exit code, signal)`` from one line of ``scontrol show job -o``; None if absent."""
    state = re.search(r"\bJobState=(\S+)", text)
    code = re.search(r"\bExitCode=(\d+):(\d+)", text)
    if not state:
        return None
    return state.group(1), int(code.group(1)) if code else 0, int(code.group(2)) if code else 0


def parse_sacct(text: str) -> tuple[str, int, int] | None:
    """``(state, exit code, signal)`` from ``sacct -n -P -X -o State,ExitCode``; None if absent."""
    for line in text.splitlines():
        state, _, code = line.strip().partition("|")
        m = re.match(r"^(\d+):(\d+)$", code)
        if state and m:
            return state.split()[0], int(m.group(1)), int(m.group(2))
    return None


def look(job_id: str) -> tuple[str, int, int] | None:
    """The job's state now: ``scontrol``, or the accounting (``sacct``) once the controller forgot it."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=60)
        found = parse_job(out.stdout) if out.returncode == 0 else None
        if found:
            return found
        acct = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # no sacct here, or a controller that does not answer
        return None
    return parse_sacct(acct.stdout) if acct.returncode == 0 else None


def status(state: str, code: int, signal: int) -> int:
    """The exit status ``sbatch --wait`` would give for a job that ended this way."""
    if code:
        return code
    if signal:
        return 128 + signal
    return 0 if state == "COMPLETED" else 1


def wait(job_id: str, look: Callable[[str], tuple[str, int, int] | None] = look,
         sleep: Callable[[float], None] = time.sleep, lost_after: int = 12) -> tuple[str, int]:
    """Poll until the job ends; ``(state, exit status)``. A job Slurm stops knowing (``lost_after``
    looks in a row, about a minute) ends as ``("LOST", 1)``."""
    every, misses = FIRST, 0
    while True:
        found = look(job_id)
        if found and found[0] in ENDED:
            return found[0], status(*found)
        misses = 0 if found else misses + 1
        if misses >= lost_after:
            return "LOST", 1
        sleep(every)
        every = min(MOST, every * GROWTH)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signum)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m labkit.launching.slurm_wait JOB.sbatch", file=sys.stderr)
        return 2
    try:
        job_id = submit(argv[0])
    except SubmitError as e:
        print(e, file=sys.stderr)
        return e.code
    print(job_id, flush=True)
    # Stopped (Ctrl-C, or SIGTERM from whoever started it): the job goes too, as it would with srun.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        state, code = wait(job_id)
    except KeyboardInterrupt as e:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
        print(f"slurm_wait: stopped; job {job_id} cancelled", file=sys.stderr)
        return 128 + (e.args[0] if e.args else signal.SIGINT)
    if state == "LOST":
        print(f"slurm_wait: Slurm no longer knows job {job_id}: its exit status is lost", file=sys.stderr)
    else:
        print(f"slurm_wait: job {job_id} {state}, exit status {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
