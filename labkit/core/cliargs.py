"""Argument types for the command line: bad values get argparse's clear message, not a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def _number(text: str, kind: type) -> int | float:
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def positive_int(text: str) -> int:
    """1, 2, ... (worker counts, repeats, nodes)."""
    n = int(_number(text, int))
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def nonnegative_int(text: str) -> int:
    """0, 1, 2, ... (parameter servers, GPUs per task)."""
    n = int(_number(text, int))
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def positive_float(text: str) -> float:
    """A number above 0 (seconds)."""
    x = float(_number(text, float))
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return x


def nonnegative_float(text: str) -> float:
    """A number of 0 or more (scores)."""
    x = float(_number(text, float))
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return x


def accuracy(text: str) -> float:
    """An accuracy between 0 and 1."""
    x = float(_number(text, float))
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (e.g. 0.82), got {text}")
    return x


# ----------------------------------------------------------------------------- one grammar, one form of error


class UsageError(ValueError):
    """A wrong call of a command: shown as ``labkit CMD: message``, exit status 2, before anything starts."""


class Parser(argparse.ArgumentParser):
    """argparse with labkit's one form of usage error: ``labkit CMD: message``, exit status 2.

    Sub-command parsers inherit the class, so every command answers alike. Descriptions and
    epilogs keep their line breaks (each example on a line of its own).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # NoReturn
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")

    def format_usage(self) -> str:
        return self._with_args(super().format_usage())

    def format_help(self) -> str:
        return self._with_args(super().format_help())

    def _with_args(self, text: str) -> str:
        """The usage line of a command that runs a script ends with its ``[-- ARGS]``."""
        if not getattr(self, "script_args", False):
            return text
        usage, sep, rest = text.partition("\n\n")
        return usage.rstrip() + " [-- ARGS]" + (sep + rest if sep else "\n")


def add_script(p: argparse.ArgumentParser, required: bool = True, what: str = "the training script") -> None:
    """The ``SCRIPT`` of a command that runs one: options go before or after it, the script's own
    arguments after ``--`` (:func:`split_dashdash`)."""
    p.add_argument("script", nargs=None if required else "?", metavar="SCRIPT",
                   help=f"{what}; options go before or after it, the script's own arguments after --")
    p.script_args = True  # its usage line shows [-- ARGS]


def split_dashdash(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``argv`` before the first ``--``, and what follows it (None without ``--``)."""
    if "--" not in argv:
        return list(argv), None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def script_of(command: list[str]) -> str | None:
    """The script a command runs: its first ``*.py`` argument."""
    return next((c for c in command if str(c).endswith(".py")), None)


def route_word(p: argparse.ArgumentParser, word: str, handler: Callable[[argparse.Namespace, int | None], int]) -> None:
    """Let ``WORD`` stand where ``p``'s command takes a SCRIPT (``labkit bench allreduce``): the call goes to
    ``handler(args, np)`` (``np`` None unless one ``--np`` was given); any other SCRIPT goes where it went before."""
    nps, before = p.get_default("np"), p.get_default("func")
    words = tuple(p.get_default("script_words") or ())

    def route(a: argparse.Namespace) -> int:
        if a.script != word:
            return before(a)
        if a.args:
            print(f"labkit {a.subcommand} {word}: nothing goes after --", file=sys.stderr)
            return 2
        if a.np is not nps and len(a.np) != 1:
            print(f"labkit {a.subcommand} {word}: give one worker count (--np 2)", file=sys.stderr)
            return 2
        return handler(a, None if a.np is nps else a.np[0])

    p.set_defaults(func=route, script_words=(*words, word))
