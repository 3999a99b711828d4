"""The one way convolutions are narrowed in a process (a probe's narrow model, ``labkit bench --shrink``).

:func:`hook`, run on tf-keras's module by the observer (:meth:`labkit.instrument.observer.Observer.narrow`), gives
every ``Conv2D`` the script builds ``width(filters)`` filters, however it names the class
(``tf.keras.layers.Conv2D``, ``Convolution2D``, a subclass of its own); tf-keras's other convolutions that derive
from it (``Conv2DTranspose``) are left as they are, and a layer rebuilt from a saved configuration (``from_config``:
loading a saved model, ``clone_model``) keeps the filters it was saved with. The class is patched when
``tf_keras.src.layers.convolutional.conv2d`` is executed (a private path, listed in
:mod:`labkit.instrument.private_names`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

MODULE = "tf_keras.src.layers.convolutional.conv2d"


def hook(width: Callable[[int], int]) -> Callable[[Any], None]:
    """What to run on tf-keras's module so that every ``Conv2D`` built from then on gets ``width(filters)``
    filters."""
    return lambda module: narrow_class(module.Conv2D, width)


def narrow_class(cls: Any, width: Callable[[int], int]) -> None:
    """Patch ``cls`` itself (exposed for tests, which narrow a class of their own)."""
    real_init = cls.__init__
    real_from_config = cls.from_config.__func__
    rebuilding = threading.local()

    def __init__(self: Any, filters: Any, *a: Any, **k: Any) -> None:
        own = type(self) is cls or not type(self).__module__.startswith(cls.__module__.split(".")[0])
        if own and not getattr(rebuilding, "on", False):
            filters = width(int(filters))
        real_init(self, filters, *a, **k)

    def from_config(klass: Any, config: Any) -> Any:
        rebuilding.on = True
        try:
            return real_from_config(klass, config)
        finally:
            rebuilding.on = False

    cls.__init__ = __init__
    cls.from_config = classmethod(from_config)
