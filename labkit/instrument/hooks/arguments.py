"""The one wrapper on ``argparse.ArgumentParser.parse_known_args``, shared by every observer of a process.

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


def new_hook() -> Listeners[Listener]:
    """The listeners of the command line's parsing; the wrapper goes in with the first."""
    return Listeners(lambda: _wrap(argparse.ArgumentParser))


_HOOK = new_hook()


def add(listener: Listener) -> None:
    """Call ``listener`` at every parse of the command line from now on (once, however often it is added)."""
    _HOOK.add(listener)


def _wrap(parser_cls: Any) -> None:
    real = parser_cls.parse_known_args

    def parse_known_args(self: Any, args: Any = None, namespace: Any = None) -> Any:
        ns, extras = real(self, args, namespace)
        if args is not None and list(args) != sys.argv[1:]:
            return ns, extras  # a parser the script runs on its own list, not the command line
        for listener in list(_HOOK.items):
            extras = listener(ns, list(extras))
        return ns, extras

    parser_cls.parse_known_args = parse_known_args
