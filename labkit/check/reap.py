"""``python -m labkit.check.reap REPORT -- CMD ...``: run CMD, then stop everything it left, even what escaped.

The dry run of a batch script (:mod:`labkit.check.sbatch_dry`) runs the learner's script under this wrapper. It
becomes the *subreaper* of what CMD starts (:func:`labkit.core.orphans.adopt_orphans`), so a process that left
CMD's session (``setsid``) or dropped the job's mark from its environment (``env -i``) is still its descendant.
When CMD ends it writes ``REPORT`` (JSON: CMD's exit code and the command lines still running, which it then
kills); on SIGTERM (the check's time is up) it kills every descendant at once, whatever signals they ignore.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil

from labkit.core.orphans import adopt_orphans, die_with_parent


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def kill_all() -> list[str]:
    """Kill every descendant (SIGKILL, twice over for what forks meanwhile); their command lines."""
    names: list[str] = []
    for _ in range(3):
        left = descendants()
        if not left:
            break
        for p in left:
            try:
                names.append(" ".join(p.cmdline()) or p.name())
                p.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(left, timeout=1.0)
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m labkit.check.reap REPORT -- CMD [ARGS...]", file=sys.stderr)
        return 2
    report, cmd = argv[0], argv[2:]
    adopt_orphans()

    def stop(signum: int, _frame: object) -> None:
        kill_all()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    child = subprocess.Popen(cmd, preexec_fn=die_with_parent)
    code = child.wait()
    left = kill_all()
    with open(report, "w") as f:
        json.dump({"code": code if code >= 0 else 128 - code, "left": left}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
