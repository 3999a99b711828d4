"""The one way Fashion-MNIST's ``load_data`` is replaced in a process (a probe's tiny slice, the
tf.distribute probe's tagged images, ``labkit bench --shrink``'s first images).

:func:`hook` (run by :meth:`labkit.instrument.observer.Observer.replace_data`) gives ``make(real)`` the loader in
force and puts what it returns in every module a script may import ``load_data`` from: tf-keras's own module
(``tf_keras.src.datasets.fashion_mnist``, a private path listed in :mod:`labkit.instrument.private_names`) as soon
as it is executed, so the public modules that import the name from it get the replacement, and every already loaded
module that holds the loader in force.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

MODULE = "tf_keras.src.datasets.fashion_mnist"
Loader = Callable[..., Any]


def hook(make: Callable[[Loader], Loader]) -> Callable[[Any], None]:
    """What to run on tf-keras's module so that Fashion-MNIST's ``load_data`` becomes ``make(the loader in
    force)`` wherever a script may import it from."""

    def on_module(module: Any) -> None:
        real = module.load_data
        new = make(real)
        for other in list(sys.modules.values()):  # the public modules already loaded hold the name too
            # Their own namespace only: a lazy module's attribute lookup would import what it stands for.
            if isinstance(getattr(other, "__dict__", None), dict) and other.__dict__.get("load_data") is real:
                other.load_data = new
        module.load_data = new

    return on_module
