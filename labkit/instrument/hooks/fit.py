"""The one wrapper on tf-keras's ``Model.fit``, shared by every probe of a process.

A probe adds a :class:`Listener` to its process's table (:attr:`labkit.instrument.observer.Observer.fit`); at each
call of ``fit`` the wrapper binds fit's arguments by name (defaults filled in, ``callbacks`` always a list) into a
:class:`FitCall`, runs every listener's ``before`` in the order they were added (each may change the arguments,
typically to append its callback), calls the real ``fit``, and then every listener's ``after`` (also when ``fit``
raised: ``call.error`` says so). A listener's exception reaches the script: an observer that must never break the
run catches its own.

The wrapper is installed once, when tf-keras's training module is executed: ``tf_keras.src.engine.training``
is a private module path, listed in :mod:`labkit.instrument.private_names` (``Model.fit`` itself is public).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol

from labkit.instrument.hooks.listeners import Listeners

MODULE = "tf_keras.src.engine.training"


@dataclass
class FitCall:
    """One call of ``fit``: the model, its arguments by name (``self`` left out), and how it ended."""

    model: Any
    arguments: dict[str, Any]
    history: Any = None
    error: BaseException | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # what a listener keeps between its before and after

    @property
    def callbacks(self) -> list[Any]:
        return self.arguments["callbacks"]


class Listener(Protocol):
    def before(self, call: FitCall) -> None: ...

    def after(self, call: FitCall) -> None: ...


def wrap(model_cls: Any, listeners: Listeners[Listener]) -> None:
    """Replace ``model_cls.fit`` (tf-keras's ``Model``, or a test's class) by the wrapper calling ``listeners``."""
    real_fit = model_cls.fit
    signature = inspect.signature(real_fit)

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        around = list(listeners.items)
        if not around:
            return real_fit(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)  # a wrong call raises fit's own TypeError, as without us
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        arguments["callbacks"] = list(arguments.get("callbacks") or [])
        call = FitCall(self, arguments)
        done: list[Listener] = []
        try:
            for listener in around:
                done.append(listener)
                listener.before(call)
            call.history = real_fit(self, **call.arguments)
            return call.history
        except BaseException as e:
            call.error = e
            raise
        finally:
            for listener in reversed(done):
                listener.after(call)

    fit.__wrapped__ = real_fit  # type: ignore[attr-defined]
    model_cls.fit = fit
