"""Which version and columns of one dataset to read, and how: :class:`SourceOptions`, checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lance_prefetch._validate import check_choice, check_names, check_str_mapping, check_version

__all__ = ["IO_CHOICES", "SourceOptions"]

#: The readers ``io`` chooses from, each with a few words on it.
IO_CHOICES = {
    "auto": "io_uring for local files where the kernel allows it, else Lance's reader",
    "default": "Lance's reader",
    "uring": "its io_uring reader, local files only",
}


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """Which version and columns of a dataset to read, and how.

    Args:
        columns (Sequence[str], optional): columns or dotted paths into structs (``"a.b"``), in
            order. Default: ``None``, all top-level columns.
        version (int | str, optional): version number (``>= 1``) or tag. Default: ``None``, the
            latest at construction.
        storage_options (Mapping[str, str], optional): passed to Lance as they are. Default:
            ``None``.
        io (str, optional): ``"auto"``, ``"default"`` or ``"uring"`` (``None`` is ``"auto"``).
            Default: ``"auto"``.

    Raises:
        TypeError, ValueError: a field has the wrong type or value (the message names it).
    """

    columns: Sequence[str] | None = None
    version: int | str | None = None
    storage_options: Mapping[str, str] | None = None
    io: str | None = "auto"

    def __post_init__(self) -> None:
        _set(self, "storage_options", check_str_mapping("storage_options", self.storage_options))
        _set(self, "columns", check_names("columns", self.columns))
        _set(self, "version", check_version("version", self.version))
        io = check_choice("io", self.io, tuple(IO_CHOICES), none=True, explain=IO_CHOICES)
        _set(self, "io", io or "auto")


def _set(options: object, name: str, value: Any) -> None:
    """Store a normalised value in a frozen dataclass (from its ``__post_init__`` only)."""
    object.__setattr__(options, name, value)
