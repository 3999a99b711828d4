"""Per-rank wrapper used by :mod:`labkit.launch`: ``python -m labkit.rank LOGDIR -- CMD...``.

It runs ``CMD`` with its output captured, writes every byte to ``LOGDIR/rank.N.log``,
copies rank 0's output to its own stdout (which the launcher streams), forwards
termination signals, and makes sure the command dies with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from labkit import contract
from labkit.proc import die_with_parent

# Who set the rank: Horovod, OpenMPI's mpirun, a PMI/PMIx launcher (srun --mpi=...), Slurm, labkit.
RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", contract.RANK)


def rank_from_env(environ: dict[str, str] | os._Environ = os.environ) -> int:
    """This process's rank as set by mpirun/horovodrun/labkit (0 when none is set)."""
    for var in RANK_VARS:
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return 0


def _orphan_watch(child: subprocess.Popen, every: float = 1.0) -> None:
    """If the launcher (our parent) dies without stopping us, stop the command: no orphans."""
    parent = os.getppid()
    while child.poll() is None:
        if os.getppid() != parent:
            child.kill()
            return
        time.sleep(every)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m labkit.rank LOGDIR -- CMD [ARGS...]", file=sys.stderr)
        return 2
    log_dir, cmd = argv[0], argv[2:]
    from labkit import observe

    observe.stop()  # the wrapper is not the script: only the command it runs is observed
    rank = rank_from_env()
    show = rank == (contract.current().show_rank or 0)
    os.makedirs(log_dir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{contract.RANK: str(rank)})
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
    )

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, forward)
    threading.Thread(target=_orphan_watch, args=(child,), daemon=True).start()
    out = sys.stdout.buffer
    assert child.stdout is not None
    with open(os.path.join(log_dir, f"rank.{rank}.log"), "wb", buffering=0) as log:
        fd = child.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:
                continue
            if not chunk:
                break
            log.write(chunk)
            if show:
                out.write(chunk)
                out.flush()
    code = child.wait()
    if code < 0:  # killed by a signal: report it the shell way
        code = 128 - code
    with open(os.path.join(log_dir, f"rank.{rank}.exit"), "w") as f:
        f.write(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
