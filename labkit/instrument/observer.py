"""The one observer of a rank: everything labkit holds in a learner's process, in one object.

Every probe of :mod:`labkit.instrument.start` changes library behaviour only through :data:`OBSERVER`:

* :attr:`Observer.fit`, :attr:`Observer.arguments` and :attr:`Observer.closures` are the listener tables of the
  shared hooks (:mod:`labkit.instrument.hooks.fit`, :mod:`~labkit.instrument.hooks.arguments`,
  :mod:`~labkit.instrument.hooks.coordinator`); each hook goes in with its first listener and reads its
  listeners from here, so a hook is installed once however many probes listen, and a test makes an
  :class:`Observer` of its own;
* :meth:`Observer.when_imported` runs a patch on a library module right after it is executed (the finder of
  :mod:`labkit.core.patch` it owns goes into ``sys.meta_path`` with the first);
* :attr:`Observer.run` is the run probe's record being observed (:mod:`labkit.instrument.observe`).

Nothing else in :mod:`labkit.instrument` keeps state at module level, but for a bounded memo of the data set's files
(:func:`labkit.instrument.data.load`); ``tests/unit/test_observer.py`` says so.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from labkit.core import contract, patch
from labkit.instrument.hooks import arguments, conv, coordinator, dataset, fit
from labkit.instrument.hooks.listeners import Listeners
from labkit.records.observation import Observation


class RunState:
    """What the run probe saw so far (``record``, written to ``observed.PID.json``), and what it holds only while
    the script runs (the strategy, the parsed arguments)."""

    def __init__(self) -> None:
        self.record = Observation()
        self.strategy: Any = None
        self.args: Any = None
        self.installed = False  # the run probe's listeners and patches are in (once per process)

    def begin(self, folder: str | None) -> None:
        """A fresh record for the run about to start in ``folder``."""
        self.record = Observation(pid=os.getpid(), started=time.time(), folder=folder,
                                  task=contract.settings().task)
        self.strategy = self.args = None

    def error(self, what: str) -> None:
        """An observer's error: kept in the record, never raised into the script."""
        self.record.observer_errors.append(what)


class Observer:
    """The hooks of one process, their listeners, and the run probe's state."""

    def __init__(self) -> None:
        self.finder = patch.AfterImport()
        self.fit: Listeners[fit.Listener] = Listeners(
            lambda: self.when_imported(fit.MODULE, lambda module: fit.wrap(module.Model, self.fit)))
        self.arguments: Listeners[arguments.Listener] = Listeners(
            lambda: arguments.wrap(argparse.ArgumentParser, self.arguments))
        self.closures: Listeners[coordinator.Listener] = Listeners(  # only the run probe listens: noted if it fails
            lambda: self.when_imported(coordinator.MODULE, lambda module: coordinator.wrap(module, self.closures),
                                       noted=True))
        self.run = RunState()

    def when_imported(self, name: str, hook: Callable[[Any], None], noted: bool = False) -> None:
        """Call ``hook(module)`` now if ``name`` is loaded, else right after it is executed. With ``noted`` a hook
        that fails is noted in the run's record (:meth:`RunState.error`), never raised into the script."""
        if noted:
            real = hook

            def hook(module: Any) -> None:
                try:
                    real(module)
                except Exception as e:  # noqa: BLE001 - observing must never break the script
                    self.run.error(f"{name}: {type(e).__name__}: {e}")

        self.finder.when_imported(name, hook)

    def narrow(self, width: Callable[[int], int]) -> None:
        """Every ``Conv2D`` built from now on gets ``width(filters)`` filters (:mod:`labkit.instrument.hooks.conv`)."""
        self.when_imported(conv.MODULE, conv.hook(width))

    def replace_data(self, make: Callable[[dataset.Loader], dataset.Loader]) -> None:
        """Fashion-MNIST's ``load_data`` becomes ``make(the loader in force)`` wherever a script may import it from
        (:mod:`labkit.instrument.hooks.dataset`)."""
        self.when_imported(dataset.MODULE, dataset.hook(make))


# The process's one observer: with the data set's memo, the only module-level state of labkit.instrument.
OBSERVER = Observer()
