"""Argument checks shared by the public entry points.

Every check names the parameter, the value it got and what would be accepted, and raises
``TypeError`` for a wrong type and ``ValueError`` for a wrong value (the convention of
``torch.utils.data`` and anyio).
"""

from __future__ import annotations

import operator
from typing import Any


def check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """Return ``value`` as a Python ``int`` after checking its type and lower bound.

    Accepts ``int`` and numpy integers (anything with ``__index__``) but not ``bool``, so that
    ``batch_size=True`` or ``batch_size=2.0`` is refused instead of silently becoming ``1``/``2``.

    Raises:
        TypeError: ``value`` is a bool, a float or not an integer at all.
        ValueError: ``value`` is smaller than ``minimum``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} should be an integer, but got {name}={value!r} (a bool)")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} should be an integer, but got {name}={value!r} ({type(value).__name__})"
        ) from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} should be an integer >= {minimum}, but got {name}={number}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool``; anything else (``0``, ``"yes"``, ``None``) is refused.

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} should be True or False, but got {name}={value!r}")
    return value
