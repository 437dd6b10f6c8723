"""What every source that wraps another shares: its identity, read from the wrapped source
(:class:`SourceIdentity`), the rest of the :class:`~lance_prefetch.sources._protocol.RowSource`
members forwarded (:class:`WrappedSource`), and the one check that offsets are in range
(:func:`check_range`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from lance_prefetch.sources._protocol import OptionsRepr, RowSource

__all__ = ["SourceIdentity", "WrappedSource", "check_range"]


def check_range(indices: np.ndarray, num_rows: int, *, what: str, of: str) -> None:
    """Refuse ``indices`` outside ``[0, num_rows)`` before any read (Lance silently drops an
    out-of-range offset followed by a valid one).

    Args:
        indices (numpy.ndarray): shape ``(rows,)``, integer dtype.
        num_rows (int): the rows there are.
        what (str): what the indices are, for the message (``"row offsets"``).
        of (str): the rows they index, for the message (``"for 'uri' version 3"``).

    Raises:
        IndexError: ``"{what} must be in [0, {num_rows}) {of}, but got min {min}, max {max}"``.
    """
    if len(indices):
        low, high = int(np.min(indices)), int(np.max(indices))
        if low < 0 or high >= num_rows:
            raise IndexError(
                f"{what} must be in [0, {num_rows}) {of}, but got min {low}, max {high}"
            )


class SourceIdentity:
    """The identity of a source of rows, read from the source in ``self._source`` (a
    :class:`~lance_prefetch.sources._protocol.RowSource`): its URI, pinned version, columns and
    reader. The public readers show their source's identity through it."""

    _source: RowSource

    @property
    def uri(self) -> str:
        """The dataset's URI."""
        return self._source.uri

    @property
    def version(self) -> int:
        """The pinned dataset version that every read uses."""
        return self._source.version

    @property
    def columns(self) -> tuple[str, ...]:
        """The projection: the columns each batch (or row) holds, in order."""
        return self._source.columns

    @property
    def io(self) -> str:
        """The reader in use: ``"default"`` or ``"uring"`` (``"default"`` after a fallback)."""
        return self._source.io


class WrappedSource(SourceIdentity):
    """A :class:`~lance_prefetch.sources._protocol.RowSource` over another, ``inner``: every
    member is ``inner``'s until a subclass overrides it (a subset maps positions, a cache serves
    rows it holds). A subclass that changes which rows there are overrides ``num_rows``,
    ``check_offsets`` (with :func:`check_range`), ``take`` and ``cached_rows`` together.

    Args:
        inner (RowSource): the wrapped source.
    """

    def __init__(self, inner: RowSource) -> None:
        self._source = inner

    @property
    def inner(self) -> RowSource:
        """The wrapped source."""
        return self._source

    @property
    def schema(self) -> pa.Schema:
        """The projected schema."""
        return self._source.schema

    @property
    def num_rows(self) -> int:
        """The wrapped source's rows."""
        return self._source.num_rows

    @property
    def cached(self) -> bool | None:
        """As the wrapped source's."""
        return self._source.cached

    def cached_rows(self, indices: np.ndarray) -> int | None:
        """As the wrapped source's."""
        return self._source.cached_rows(indices)

    @property
    def ready(self) -> bool:
        """``False``: rows are read by :meth:`take`. Not forwarded: a wrapper's rows are not
        its inner source's at the same indices (only the caches, which wrap, gather)."""
        return False

    def gather(self, indices: np.ndarray) -> Any:
        """``None``: rows are read by :meth:`take` (see :attr:`ready`)."""
        return None

    def take(self, indices: np.ndarray) -> pa.Table:
        """The wrapped source's rows at ``indices``."""
        return self._source.take(indices)

    def check_offsets(self, indices: np.ndarray) -> None:
        """As the wrapped source's (``IndexError`` outside ``[0, num_rows)``)."""
        self._source.check_offsets(indices)

    def check_process(self) -> None:
        """As the wrapped source's."""
        self._source.check_process()

    def prepare(self) -> None:
        """As the wrapped source's (a cache under it fills here)."""
        self._source.prepare()

    def options_repr(self) -> OptionsRepr:
        """As the wrapped source's: storage options with secret values hidden."""
        return self._source.options_repr()
