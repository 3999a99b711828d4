"""Run a script as ``__main__`` with labkit impossible to import: ``python no_labkit.py SCRIPT ARGS``.

The lab scripts must run on a machine that has only TensorFlow, tf-keras and
Horovod. Any ``import labkit`` in them (or in what they import) raises here.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "labkit" or name.startswith("labkit."):
            raise ImportError(f"{name} is not importable here: lab scripts must not need labkit")
        return None


if __name__ == "__main__":
    for loaded in [m for m in sys.modules if m == "labkit" or m.startswith("labkit.")]:
        del sys.modules[loaded]
    sys.meta_path.insert(0, _Blocked())
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
