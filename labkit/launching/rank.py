"""Per-rank wrapper used by :mod:`labkit.launching.launch`: ``python -m labkit.launching.rank LOGDIR -- CMD...``.

It runs ``CMD`` with its output captured, writes its output to ``LOGDIR/rank.N.log``
(the first :data:`LOG_HEAD` bytes and the last :data:`LOG_TAIL`, so a flood of output
cannot fill the disk; past the head it is read at most :data:`FLOOD_RATE` bytes a second, so it cannot take the
cores either), copies rank 0's output to its own stdout (which the launcher
streams), forwards termination signals (a probe that writes its stacks first gets SIGUSR1,
:func:`labkit.instrument.start.dumps_stacks`, on which it writes where it is, even when the script ignores
SIGTERM), and makes sure the command dies with it.

The rank ends when ``CMD`` ends: processes ``CMD`` started and left running (a server,
a ``sleep``) are adopted by this wrapper (it is their *subreaper*), stopped, and named
in ``LOGDIR/rank.N.left`` (one JSON list of command lines); they are not waited for,
even when they still hold the output pipe open.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil

from labkit.core import contract, identity
from labkit.core.orphans import adopt_orphans, die_with_parent
from labkit.core.pipes import read_chunks
from labkit.instrument.start import dumps_stacks

LOG_HEAD = 32 << 20  # bytes of a rank's output logged from its start
LOG_TAIL = 1 << 20  # bytes kept from its end once the head is full
# Past the head a flood is read at most this fast: the command then waits on its full pipe instead of taking
# the machine's cores from the launcher, which must still be able to stop it on time.
FLOOD_RATE = 4 << 20  # bytes per second


def _orphan_watch(child: subprocess.Popen, every: float = 1.0) -> None:
    """If the launcher (our parent) dies without stopping us, stop the command: no orphans."""
    parent = os.getppid()
    while child.poll() is None:
        if os.getppid() != parent:
            child.kill()
            return
        time.sleep(every)


class CappedLog:
    """A log file that keeps the first ``head`` bytes and, past them, only the last ``tail`` bytes."""

    def __init__(self, path: str, head: int = LOG_HEAD, tail: int = LOG_TAIL) -> None:
        self.path, self.head, self.tail = path, head, tail
        self.f = open(path, "wb", buffering=0)  # closed by close()
        self.written = self.dropped = 0
        self.end = bytearray()

    @property
    def full(self) -> bool:
        return self.written >= self.head

    def write(self, chunk: bytes) -> None:
        if self.f.closed:
            return
        room = self.head - self.written
        if room > 0:
            self.f.write(chunk[:room])
            self.written += min(room, len(chunk))
            chunk = chunk[room:]
        if chunk:
            self.end += chunk
            if len(self.end) > self.tail:
                self.dropped += len(self.end) - self.tail
                del self.end[: len(self.end) - self.tail]

    def close(self) -> None:
        if self.dropped or self.end:
            if self.dropped:
                self.f.write(f"\n[... {self.dropped} bytes of output left out ...]\n".encode())
            self.f.write(bytes(self.end))
        self.f.close()


def _pump(fd: int, log: CappedLog, show: bool) -> None:
    out = sys.stdout.buffer
    for chunk in read_chunks(fd):
        shown = not log.full
        if not shown:
            time.sleep(len(chunk) / FLOOD_RATE)
        log.write(chunk)
        if show and shown:
            out.write(chunk)
            if log.full:
                out.write(b"\n[output too large: the rest is left out here; the log keeps its end]\n")
            out.flush()


def stop_left_behind(grace: float = 1.0) -> list[str]:
    """Stop every process still running below this one (adopted orphans included); their command lines."""
    try:
        left = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    names = []
    for p in left:
        try:
            names.append(" ".join(p.cmdline()) or p.name())
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(left, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return names


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m labkit.launching.rank LOGDIR -- CMD [ARGS...]", file=sys.stderr)
        return 2
    log_dir, cmd = argv[0], argv[2:]

    rank = identity.rank_from_env()
    show = rank == (contract.current().show_rank or 0)
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, f"rank.{rank}.host"), "w") as f:  # where it runs, for failure reports
        f.write(socket.gethostname())
    adopt_orphans()  # what the command leaves behind becomes ours to stop
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{contract.RANK: str(rank)})
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
    )

    probed = dumps_stacks(cmd)

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            if probed and signum != signal.SIGUSR1:  # the probe dumps its stacks first, even if the script is deaf
                child.send_signal(signal.SIGUSR1)
                time.sleep(0.2)
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, forward)
    threading.Thread(target=_orphan_watch, args=(child,), daemon=True).start()
    assert child.stdout is not None
    log = CappedLog(os.path.join(log_dir, f"rank.{rank}.log"))
    pump = threading.Thread(target=_pump, args=(child.stdout.fileno(), log, show), daemon=True)
    pump.start()
    code = child.wait()
    pump.join(0.5)  # the output ends with the command, unless something it started holds the pipe
    left = stop_left_behind()
    pump.join(5.0)
    log.close()
    if code < 0:  # killed by a signal: report it the shell way
        code = 128 - code
    os.makedirs(log_dir, exist_ok=True)  # the command may have deleted it
    if left:
        with open(os.path.join(log_dir, f"rank.{rank}.left"), "w") as f:
            json.dump(left, f)
    with open(os.path.join(log_dir, f"rank.{rank}.exit"), "w") as f:
        f.write(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
