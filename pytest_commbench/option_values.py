"""How an option's text becomes its value: one parser per kind of value, the same for the
command line, the environment and ini files; a bad value is a `pytest.UsageError` whose
sentence says what was expected (the caller adds where the text came from)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from . import shards


def number(kind: type, minimum: float, inclusive: bool, what: str) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise pytest.UsageError(f"expected {what}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise pytest.UsageError(f"expected {what}, got {text!r}")
        if value < minimum or (value == minimum and not inclusive):
            sign = ">=" if inclusive else ">"
            raise pytest.UsageError(f"expected {what} {sign} {minimum:g}, got {text}")
        return value

    return parse


def integer(text: str) -> int:
    try:
        return int(str(text).strip(), 0)
    except ValueError:
        raise pytest.UsageError(f"expected an integer, got {text!r}") from None


def on_off(text: str) -> str:
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return "on"
    if word in ("0", "false", "no", "off"):
        return "off"
    raise pytest.UsageError(f"expected on or off, got {text!r}")


def choice(*words: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        word = str(text).strip().lower()
        if word not in words:
            raise pytest.UsageError(f"expected one of {', '.join(words)}, got {text!r}")
        return word

    return parse


def text(text: str) -> str:
    if not str(text).strip():
        raise pytest.UsageError("expected a value, got nothing")
    return str(text)


def shard(text: str) -> shards.Shard:
    try:
        return shards.parse(text)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def run_name(text: str) -> str:
    try:
        return shards.parse_name(text)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def flag(text: str) -> bool:
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise pytest.UsageError(f"expected true or false (1/0, yes/no, on/off), got {text!r}")


count = number(int, 0, True, "a whole number")
positive_count = number(int, 1, True, "a whole number")
seconds = number(float, 0, False, "seconds")
nonnegative_seconds = number(float, 0, True, "seconds")
fraction = number(float, 0, True, "a fraction")
