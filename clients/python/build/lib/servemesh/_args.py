"""Argument checks of the client's verbs.

A wrong type is a TypeError naming the verb, the argument, the type it
must be and the type it got, raised before anything is sent, as Ray
Serve's verbs raise them. Values (a weight out of range, an unknown
backend) are the controller's to judge: it answers InvalidError,
NotFoundError or ConflictError, each a ValueError as Ray's are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any


def _fail(verb: str, arg: str, want: str, value: Any) -> TypeError:
    return TypeError(f"{verb}(): {arg} must be {want}, not {type(value).__name__}")


def name(verb: str, arg: str, value: Any) -> None:
    """value is a name: a str."""
    if not isinstance(value, str):
        raise _fail(verb, arg, "a str (a name)", value)


def optional_str(verb: str, arg: str, value: Any) -> None:
    """value is None or a str."""
    if value is not None and not isinstance(value, str):
        raise _fail(verb, arg, "a str or None", value)


def flag(verb: str, arg: str, value: Any) -> None:
    """value is a bool."""
    if not isinstance(value, bool):
        raise _fail(verb, arg, "a bool", value)


def optional_flag(verb: str, arg: str, value: Any) -> None:
    """value is None or a bool."""
    if value is not None and not isinstance(value, bool):
        raise _fail(verb, arg, "a bool or None", value)


def number(verb: str, arg: str, value: Any) -> None:
    """value is a real number (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _fail(verb, arg, "a number", value)


def mapping(verb: str, arg: str, value: Any, optional: bool = False) -> None:
    """value is a mapping with str keys (None too if optional)."""
    if optional and value is None:
        return
    if not isinstance(value, Mapping):
        raise _fail(verb, arg, "a mapping (such as a dict)" + (" or None" if optional else ""), value)
    for key in value:
        if not isinstance(key, str):
            raise _fail(verb, f"{arg}'s keys", "str", key)


def weights(verb: str, arg: str, value: Any, optional: bool = False) -> None:
    """value maps backend names to numbers (None too if optional)."""
    mapping(verb, arg, value, optional)
    for key, weight in (value or {}).items():
        number(verb, f"{arg}[{key!r}]", weight)


def strings(verb: str, arg: str, value: Any) -> None:
    """value is None or a sequence of str, and not a str itself (a str is
    a sequence of one-letter strs, which is never what is meant)."""
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _fail(verb, arg, "a list of str", value)
    for item in value:
        if not isinstance(item, str):
            raise _fail(verb, f"{arg}'s items", "str", item)
