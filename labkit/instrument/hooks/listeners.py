"""The listeners of one hook (:mod:`labkit.instrument.hooks`), and the hook put in place with the first of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Listeners(Generic[T]):
    """Listeners in the order they were added; ``install`` runs once, when the first one is added."""

    def __init__(self, install: Callable[[], None]) -> None:
        self.items: list[T] = []
        self.installed = False
        self._install = install

    def add(self, listener: T) -> None:
        """Add ``listener`` (once, however often it is added); put the hook in place if it is not yet."""
        if listener not in self.items:
            self.items.append(listener)
        if not self.installed:
            self.installed = True
            self._install()
