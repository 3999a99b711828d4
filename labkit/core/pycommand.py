"""What a ``python`` command is, said once: which programs are Python (``python``, ``python3``, ``python3.12``, by
any path), the interpreter's options that come before the script, and where the script is.

The starter wraps a ``python SCRIPT`` command (:mod:`labkit.instrument.start`, strict: an option this grammar does
not know leaves the command unwrapped); the scale-out check reads the script a learner's batch script runs
(:mod:`labkit.launching.launch_lines`, lenient); the plain Slurm script names Python by ``$PYTHON``
(:mod:`labkit.launching.slurm_plain`); the batch script's dry run shims the :data:`NAMES`
(:mod:`labkit.check.sbatch_dry`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
NAMES = ("python", "python3", *(f"python3.{minor}" for minor in range(8, 15)))  # the names a PATH may offer
FLAGS = frozenset("bBdEhiIOPqsSuvx")  # the interpreter's options without a value (``-u``, ``-uB``)
VALUED = ("-X", "-W")  # those taking one, as the next word or joined (``-X dev``, ``-Wignore``)
OLD_VALUED = ("-Q",)  # Python 2's, read (lenient) in a batch script, never wrapped


def is_python(program: str) -> bool:
    """Whether ``program`` (a name or a path) is a Python interpreter."""
    return bool(NAME.match(os.path.basename(program)))


def split(argv: Sequence[str], strict: bool = True) -> tuple[list[str], list[str]] | None:
    """``python [OPTIONS] SCRIPT ARGS`` as (``python OPTIONS``, ``SCRIPT ARGS``); None when it runs no script
    (``-m``, ``-c``, ``-`` alone or joined to flags as in ``-um pkg``, nothing after the options) or, ``strict``,
    has an option this grammar does not know. Whether ``argv[0]`` is Python is the caller's question
    (:func:`is_python`)."""
    argv = list(argv)
    valued = VALUED if strict else VALUED + OLD_VALUED
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg == "-" or next((c for c in arg[1:] if c not in FLAGS), "") in ("m", "c"):
            return None
        if arg in valued:
            i += 2
        elif len(arg) > 2 and arg[:2] in valued or set(arg[1:]) <= FLAGS or not strict:
            i += 1
        else:
            return None
    return (argv[:i], argv[i:]) if i < len(argv) else None
