"""Argument types for the command line: bad values get argparse's clear message, not a traceback."""

from __future__ import annotations

import argparse


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
