"""The one wrapper on ``argparse.ArgumentParser.parse_known_args``, shared by every probe of a process (its
listeners: :attr:`labkit.instrument.observer.Observer.arguments`).

``parse_args`` goes through ``parse_known_args``, so every parse passes here. For a parse of the script's own
command line (no list given, or ``sys.argv[1:]`` itself) each listener, in the order added, gets the parsed
namespace and the arguments the parser did not know, and returns the ones to keep (``parse_args`` then refuses
those). A parser the script runs on a list of its own is left alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from labkit.instrument.hooks.listeners import Listeners

Listener = Callable[[argparse.Namespace, list[str]], list[str]]


def wrap(parser_cls: Any, listeners: Listeners[Listener]) -> None:
    """Replace ``parser_cls.parse_known_args`` (argparse's, or a test's class) by the wrapper calling
    ``listeners``."""
    real = parser_cls.parse_known_args

    def parse_known_args(self: Any, args: Any = None, namespace: Any = None) -> Any:
        ns, extras = real(self, args, namespace)
        if args is not None and list(args) != sys.argv[1:]:
            return ns, extras  # a parser the script runs on its own list, not the command line
        for listener in list(listeners.items):
            extras = listener(ns, list(extras))
        return ns, extras

    parser_cls.parse_known_args = parse_known_args
