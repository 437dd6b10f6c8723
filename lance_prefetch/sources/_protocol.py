"""What the readers need of a source of rows: the :class:`RowSource` protocol, which
:class:`~lance_prefetch.sources._lance.LanceSource`, the caches over it and the sources that wrap
another (:mod:`lance_prefetch.sources._wrapped`) implement."""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa

__all__ = ["OptionsRepr", "RowSource"]

#: A source's storage options as a ``repr`` shows them (secret values hidden): one dataset's
#: dict, ``None`` (none given), or a list of its datasets' (a source of several).
OptionsRepr: TypeAlias = "dict[str, str] | list[OptionsRepr] | None"


class RowSource(Protocol):
    """What the readers need of a source of rows:
    :class:`~lance_prefetch.sources._lance.LanceSource`, the caches over it
    (:mod:`lance_prefetch.cache._disk`) and the sources wrapping another
    (:class:`~lance_prefetch.sources._wrapped.WrappedSource`) implement it. ``take`` may block;
    every other member is cheap."""

    @property
    def uri(self) -> str:
        """The dataset's URI."""

    @property
    def version(self) -> int:
        """The pinned version."""

    @property
    def num_rows(self) -> int:
        """Live rows of that version: the offsets ``0 .. num_rows-1``."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The projection, in order."""

    @property
    def schema(self) -> pa.Schema:
        """The projected schema."""

    @property
    def io(self) -> str:
        """The reader in use, ``"default"`` or ``"uring"``."""

    @property
    def cached(self) -> bool | None:
        """Whether a cache holds the rows in this process already; ``None``: no cache."""

    def cached_rows(self, indices: np.ndarray) -> int | None:
        """How many of the rows at ``indices`` a cache would serve now in this process, without
        reading the dataset (``None``: no cache)."""

    @property
    def ready(self) -> bool:
        """Whether :meth:`gather` serves every row already, as tensors, in microseconds (a
        filled memory cache, :mod:`lance_prefetch.cache._memory`, or a disk cache whose open
        copy is all raw files that fit in memory, :mod:`lance_prefetch.cache._disk`): an
        iteration without a ``transform`` then reads in the training thread and nothing ahead
        (:class:`~lance_prefetch.schedule._direct.DirectPrefetcher`). ``False`` for every other
        source."""

    def gather(self, indices: np.ndarray) -> Any:
        """The rows at ``indices`` already converted to tensors (a
        :class:`~lance_prefetch.cache._gathered.Gathered`, as
        :func:`~lance_prefetch.convert._arrow.to_tensors` would convert :meth:`take`'s table),
        or ``None``: read them with :meth:`take` then. Only a memory cache whose fill ended
        and a disk cache whose copy is open gather; every other source returns ``None`` at
        once."""

    def take(self, indices: np.ndarray) -> pa.Table:
        """The rows at ``indices`` (offsets), in that order (see :meth:`~lance_prefetch.sources._lance.LanceSource.take`)."""

    def check_offsets(self, indices: np.ndarray) -> None:
        """Refuse offsets outside ``[0, num_rows)`` (``IndexError``) before any read."""

    def check_process(self) -> None:
        """Refuse to be used in a process forked from the one that opened it
        (``RuntimeError``)."""

    def prepare(self) -> None:
        """Do in this thread, before the first read of this process, what must not run inside a
        timed, retried ``take`` (a cache's fill); a no-op for a plain source."""

    def options_repr(self) -> OptionsRepr:
        """The storage options as a ``repr`` may show them (secret values hidden)."""
