"""The one wrapper on the parameter-server coordinator's workers (``ParameterServerStrategy``): each listener
hears the index of the worker that just finished a step (a closure) the coordinator sent it, whether the step
succeeded or not. No public API tells which worker ran a step; ``Worker._process_closure`` of
``tensorflow.python.distribute.coordinator.cluster_coordinator`` is private (listed in
:mod:`labkit.instrument.private_names`). Its listeners: :attr:`labkit.instrument.observer.Observer.closures`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.instrument.hooks.listeners import Listeners

MODULE = "tensorflow.python.distribute.coordinator.cluster_coordinator"
Listener = Callable[[int], None]


def wrap(module: Any, listeners: Listeners[Listener]) -> None:
    """Replace ``module.Worker._process_closure`` (the coordinator's, or a test's module) by the wrapper calling
    ``listeners`` with the worker's index once the closure is done."""
    real = module.Worker._process_closure

    def _process_closure(self: Any, closure: Any) -> Any:
        try:
            return real(self, closure)
        finally:
            for listener in list(listeners.items):
                listener(int(self.worker_index))

    module.Worker._process_closure = _process_closure
