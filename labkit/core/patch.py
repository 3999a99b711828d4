"""Patching library modules from outside a script, for the probes and the observer.

* :class:`AfterImport` runs a hook on a module right after it is executed, before
  anyone imports names from it (so ``from tf_keras... import X`` sees the patch); a rank's one
  finder is its observer's (:mod:`labkit.instrument.observer`);
* :func:`set_everywhere` sets a name in every module path a script may import a
  Keras module from (``tensorflow.keras``, ``tf_keras``, ...).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder):
    """Run a function on a module right after it is executed (before anyone imports from it)."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[Any], None]]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hooks = self.hooks.pop(name, None)
        if not hooks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            real_exec(module)
            for hook in hooks:  # in the order they were asked for
                hook(module)

        spec.loader.exec_module = exec_module
        return spec

    def when_imported(self, name: str, hook: Callable[[Any], None]) -> None:
        """Call ``hook(module)`` now if ``name`` is loaded, else right after it is executed (this finder goes
        first into ``sys.meta_path`` with its first hook)."""
        if name in sys.modules:
            hook(sys.modules[name])
            return
        self.hooks.setdefault(name, []).append(hook)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)


def set_everywhere(tf: Any, sub: str, name: str, value: Any) -> None:
    """Set ``name`` in every module a script may import ``sub`` from.

    ``from tensorflow.keras.layers import X`` loads a module object of its own
    (registered as ``tensorflow.keras.layers``), distinct from ``tf.keras.layers``
    until then, so each path is imported first and patched.
    """
    import importlib

    for prefix in ("tensorflow.keras", "tf_keras", "tf_keras.api._v2.keras"):
        try:
            setattr(importlib.import_module(f"{prefix}.{sub}"), name, value)
        except ImportError:
            pass
    module = tf.keras
    for part in sub.split("."):
        module = getattr(module, part)
    setattr(module, name, value)
