"""How a probed rank ends: its exit functions run, the interpreter's teardown does not.

After the script has ended and the probe has written its record, a normal exit would still spend about a second
(measured on the 2-core machine, with TensorFlow and Horovod loaded) collecting TensorFlow's modules. What a
process must do on its way out is registered with :mod:`atexit` (Horovod's shutdown and MPI's finalize,
TensorFlow's own, the script's), so :func:`leave` runs those, flushes the output and ends the process.
"""

from __future__ import annotations

import atexit
import os
import sys


def leave(code: int) -> None:
    """End this process with ``code`` once its exit functions have run (a normal exit if they cannot be run)."""
    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)  # CPython's; tests/unit/test_probe.py checks it
    if run_exit_functions is None:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    run_exit_functions()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
