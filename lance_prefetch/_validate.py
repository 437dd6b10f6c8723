"""Argument checks: the one place where a user's value is judged.

Every check names the parameter, the value it got and what would be accepted, and raises
``TypeError`` for a wrong type and ``ValueError`` for a wrong value (the convention of
``torch.utils.data`` and anyio). The config objects (:mod:`lance_prefetch.loader._config`,
:class:`~lance_prefetch.RetryPolicy`, :class:`~lance_prefetch.plan.sampling.EpochPlan`) call them;
inner code trusts what they let through.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_depths",
    "check_filter",
    "check_folder",
    "check_int",
    "check_int_or_auto",
    "check_key",
    "check_names",
    "check_number",
    "check_rank",
    "check_seconds",
    "check_seed",
    "check_str_mapping",
    "check_version",
]


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


def check_seed(name: str, value: Any) -> int:
    """``value`` as a Python ``int`` in ``[0, 2**64)``: a seed or an epoch, which every random
    stream encodes in 64 bits (:mod:`lance_prefetch.plan.sampling`, "Seeds").

    Raises:
        TypeError: not an integer (or a bool).
        ValueError: negative, or ``2**64`` or more.
    """
    seed = check_int(name, value, minimum=0)
    if seed >= 2**64:
        raise ValueError(
            f"{name} should be an integer in [0, 2**64), but got {name}={seed}; pass a value "
            f"below 2**64 (e.g. {name} % 2**64)"
        )
    return seed


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool``; anything else (``0``, ``"yes"``, ``None``) is refused.

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} should be True or False, but got {name}={value!r}")
    return value


def check_int_or_auto(
    name: str, value: Any, *, minimum: int = 1, expected: str | None = None
) -> int | str:
    """``value`` as an int ``>= minimum``, or the string ``"auto"``.

    Args:
        expected (str, optional): what the ``TypeError`` says is accepted. Default: ``None``,
            "an integer or 'auto'" in :func:`check_int`'s wording.

    Raises:
        TypeError: neither an int nor ``"auto"`` (another string included).
        ValueError: an int below ``minimum``.
    """
    if isinstance(value, str) and value == "auto":
        return value
    if expected is not None and (isinstance(value, (str, bool)) or not _is_index(value)):
        raise TypeError(f"{name} should be {expected}, but got {name}={value!r}")
    if isinstance(value, str):
        raise TypeError(f"{name} should be an integer or 'auto', but got {name}={value!r} (str)")
    try:
        return check_int(name, value, minimum=minimum)
    except TypeError as exc:
        raise TypeError(
            str(exc).replace("should be an integer,", "should be an integer or 'auto',")
        ) from None


def check_choice(
    name: str,
    value: Any,
    choices: Sequence[str],
    *,
    none: bool = False,
    explain: Mapping[Any, str] | None = None,
) -> Any:
    """``value`` if it is one of ``choices`` (or ``None`` when ``none``).

    Args:
        explain (Mapping, optional): a few words on each choice for the ``ValueError`` (a
            ``None`` key explains ``None``). Default: ``None``, the choices listed alone.

    Raises:
        TypeError: not a string (nor ``None`` when allowed).
        ValueError: another string.
    """
    if value is None and none:
        return None
    if not isinstance(value, str):
        if none:
            listed = _either([repr(choice) for choice in choices] + ["None"])
            raise TypeError(f"{name} should be {listed}, but got {name}={value!r}")
        raise TypeError(f"{name} should be a string, but got {name}={value!r}")
    if value not in choices:
        if explain is None:
            listed = "one of " + ", ".join(map(repr, choices))
        else:
            described = [f"{choice!r} ({explain[choice]})" for choice in choices]
            if none and None in explain:
                described.append(f"None ({explain[None]})")
            listed = _either(described)
        raise ValueError(f"{name} should be {listed}, but got {name}={value!r}")
    return value


def check_seconds(
    name: str, value: Any, *, positive: bool = False, none_means: str | None = None
) -> float | None:
    """``value`` as a finite number of seconds (``>= 0``, or ``> 0`` when ``positive``), or
    ``None`` when ``none_means`` says what ``None`` stands for.

    Raises:
        TypeError: not a number (a bool is not one), nor an allowed ``None``.
        ValueError: negative, zero when ``positive``, infinite or NaN.
    """
    if value is None and none_means is not None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if none_means is not None:
            raise TypeError(f"{name} should be a number of seconds or None, but got {value!r}")
        raise TypeError(f"{name} should be a number of seconds, but got {name}={value!r}")
    if not ((value > 0 if positive else value >= 0) and math.isfinite(value)):
        bound = "> 0" if positive else ">= 0"
        none = f", or None for {none_means}" if none_means is not None else ""
        raise ValueError(
            f"{name} should be a finite number of seconds {bound}{none}, but got {name}={value}"
        )
    return float(value)


def check_callable(name: str, value: Any) -> Any:
    """``value`` if it is callable or ``None``.

    Raises:
        TypeError: anything else.
    """
    if value is not None and not callable(value):
        raise TypeError(f"{name} should be callable or None, but got {value!r}")
    return value


def check_depths(readahead: Any, max_in_flight: Any) -> tuple[int, int]:
    """``readahead >= 1`` and ``1 <= max_in_flight <= readahead``, as ints.

    Raises:
        TypeError: either is not an integer.
        ValueError: either is out of range.
    """
    readahead = check_int("readahead", readahead, minimum=1)
    max_in_flight = check_int("max_in_flight", max_in_flight, minimum=1)
    if max_in_flight > readahead:
        raise ValueError(
            f"max_in_flight should be <= readahead, but got max_in_flight={max_in_flight} > "
            f"readahead={readahead}; every fetch in flight holds one of the readahead slots"
        )
    return readahead, max_in_flight


def check_filter(value: Any) -> str | None:
    """``filter``: ``None``, or a non-empty string (Lance parses it at construction).

    Raises:
        TypeError: not a string (nor ``None``).
        ValueError: an empty or blank string.
    """
    if value is None:
        return None
    example = (
        'a Lance SQL predicate such as "label = 3" (as LanceDataset.scanner(filter=...) takes)'
    )
    if not isinstance(value, str):
        raise TypeError(f"filter should be {example}, or None, but got filter={value!r}")
    if not value.strip():
        raise ValueError(f"filter should be {example}, or None for every row, but got {value!r}")
    if _unquoted_semicolon(value.rstrip().rstrip(";")):  # Lance reads the first statement only
        raise ValueError(
            f"filter={value!r} holds a ';', but a filter is one predicate: Lance would read only "
            f"what comes before it and silently ignore the rest; join the conditions with AND "
            f'(e.g. "label = 3 AND score > 0.5")'
        )
    return value


def _unquoted_semicolon(text: str) -> bool:
    """Whether ``text`` has a ``;`` outside '...' strings, "..." and `...` identifiers."""
    quote = None
    for char in text:
        if quote is None and char == ";":
            return True
        if char in "'\"`":
            quote = char if quote is None else (None if char == quote else quote)
    return False


def check_names(name: str, value: Iterable[str] | None) -> tuple[str, ...] | None:
    """``value`` as a non-empty tuple of distinct strings (column names), or ``None``.

    Raises:
        TypeError: not an iterable of strings (a lone string is refused).
        ValueError: empty, or a name repeats.
    """
    if value is None:
        return None
    try:
        names = None if isinstance(value, (str, bytes)) else tuple(value)
    except TypeError:
        names = None
    if names is None or not all(isinstance(item, str) for item in names):
        raise TypeError(f"{name} should be a list of column names, but got {name}={value!r}")
    if not names:
        raise ValueError(f"{name} should name at least one column, or be None for all columns")
    if len(set(names)) != len(names):
        raise ValueError(f"{name} should not repeat a name, but got {name}={list(names)}")
    return names


def check_str_mapping(name: str, value: Any) -> dict[str, str] | None:
    """``value`` as a ``dict`` of ``str`` to ``str``, or ``None``. The message never shows the
    values (storage options hold secrets), only the keys.

    Raises:
        TypeError: not such a mapping.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        shown = (
            f"a mapping with keys {sorted(map(str, value))}"
            if isinstance(value, Mapping)
            else type(value).__name__
        )
        raise TypeError(f"{name} should be a dict of str to str, but got {shown}")
    return dict(value)


def check_version(name: str, value: Any) -> int | str | None:
    """``value`` as a dataset version: ``None``, a version number ``>= 1`` or a tag (a str).

    Raises:
        TypeError: neither an int nor a str. ValueError: a number below 1, or an empty tag.
    """
    if isinstance(value, str) and not value:
        raise ValueError(
            f"{name} should be a version number >= 1 or a tag, but got {name}=''; pass None "
            f"for the latest version"
        )
    if value is None or isinstance(value, str):
        return value
    try:
        return check_int(name, value, minimum=1)
    except TypeError:
        raise TypeError(
            f"{name} should be an int (version number) or a str (tag), but got {name}={value!r}"
        ) from None


def check_folder(name: str, value: Any) -> Any:
    """``value`` if it is ``None`` or a path (``str`` or ``os.PathLike``) to a folder, or to one
    that can be created later: not empty, and the path itself or else its nearest existing
    ancestor is a folder (a ``stat`` or two; nothing is created here).

    Raises:
        TypeError: not a path. ValueError: empty, holding a NUL character, something other
            than a folder (a file, a device), or below something other than a folder.
    """
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} should be a path (str or os.PathLike), got {value!r}")
    path = os.fspath(value)
    problem = ""
    if "\x00" in os.fsdecode(path):  # no OS path holds one (os.stat would raise ValueError)
        problem = ", which holds a NUL character"
    elif path and os.path.lexists(path):
        problem = "" if os.path.isdir(path) else ", which is not a folder"
    elif path:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        problem = "" if os.path.isdir(parent) else f", below {parent!r}, which is not a folder"
    if path == "" or problem:
        raise ValueError(
            f"{name} should be a folder (created if missing), but got {name}={path!r}{problem}; "
            f"pass a folder this process can write"
        )
    return value


def check_rank(rank: Any, world_size: Any) -> tuple[int, int]:
    """``(rank, world_size)`` as ints with ``0 <= rank < world_size``.

    Raises:
        TypeError: not integers. ValueError: out of range.
    """
    rank = check_int("rank", rank, minimum=0)
    world_size = check_int("world_size", world_size, minimum=1)
    if rank >= world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}] "
            f"for world_size={world_size}"
        )
    return rank, world_size


def check_key(name: str, value: Any, *, none: bool = False) -> str | None:
    """``value`` as a non-empty string (a batch key, a column name), or ``None`` when ``none``.

    Raises:
        TypeError: not a string (nor ``None`` when allowed).
        ValueError: the empty string.
    """
    if value is None and none:
        return None
    if not isinstance(value, str):
        allowed = "a string or None" if none else "a string"
        raise TypeError(f"{name} should be {allowed}, but got {name}={value!r}")
    if not value:
        raise ValueError(f"{name} should be a non-empty string, but got {name}=''")
    return value


def check_number(name: str, value: Any) -> int | float:
    """``value`` as an ``int`` or ``float`` if it is a finite real number (numpy scalars included),
    not a bool.

    Raises:
        TypeError: a bool, or not a real number.
        ValueError: NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} should be a number, but got {name}={value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} should be a finite number, but got {name}={value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _is_index(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _either(items: list[str]) -> str:
    """``"a, b or c"``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def check_weights(value: Any) -> tuple[float, ...] | None:
    """``weights``: ``None``, or a list of at least two finite numbers ``> 0`` (a mixture's
    proportions, one per dataset; normalised to sum to 1, also near the float limits:
    ``[1e308, 1e308]`` is ``(0.5, 0.5)``). A weight too small next to the largest for a float
    comes back ``0.0``; the mixture then refuses it
    (it gives its dataset no row an epoch: :class:`~lance_prefetch.sources._multi.MixtureSource`).

    Raises:
        TypeError: not a list of numbers. ValueError: fewer than two, or one not finite or
            ``<= 0``.
    """
    if value is None:
        return None
    example = "e.g. Mixture([uri_a, uri_b], weights=[0.7, 0.3])"
    if hasattr(value, "tolist") and not isinstance(value, Sequence):  # numpy, torch: 1-D
        value = value.tolist()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise TypeError(
            f"weights should be a list of numbers, one per dataset ({example}), but got {value!r}"
        )
    floats = []
    for i, weight in enumerate(value):
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise TypeError(f"weights[{i}] should be a number, but got {weight!r} ({example})")
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(
                f"weights[{i}] should be a finite number > 0, but got {weight!r}; "
                f"leave a dataset out of the mixture rather than weigh it 0"
            )
        floats.append(float(weight))
    if len(floats) < 2:
        raise ValueError(f"weights should list at least two numbers, but got {value!r} ({example})")
    # scaled by a power of two (exact) so that the largest is in [0.5, 1): the sum cannot overflow
    scale = -math.frexp(max(floats))[1]
    floats = [math.ldexp(weight, scale) for weight in floats]
    total = math.fsum(floats)
    return tuple(weight / total for weight in floats)
