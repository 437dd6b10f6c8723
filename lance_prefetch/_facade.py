"""What both public readers show of their source: :class:`SourceFacade`."""

from __future__ import annotations

from ._source import RowSource

__all__ = ["SourceFacade"]


class SourceFacade:
    """The dataset's identity as properties, read from ``self._source`` (a
    :class:`~lance_prefetch._source.RowSource`)."""

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
    def io(self) -> str:
        """The reader in use: ``"default"`` or ``"uring"`` (``"default"`` after a fallback)."""
        return self._source.io

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns each batch (or row) holds, in order."""
        return self._source.columns
