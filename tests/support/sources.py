"""See and steer the reads of the datasets a reader opens, without patching a class: a reader
constructed inside ``with tapped() as tap:`` has each of its datasets' ``LanceSource`` wrapped in a
:class:`TappedSource` that reports to ``tap`` (the seam ``_wrapping_sources`` of
``lance_prefetch.loader._open``). The wrapper sits beneath the cache, filter, split and mixture
layers, so it sees the reads of the dataset itself (a disk cache's reads of its local copy are not
seen), and it stays in the reader after the ``with`` ends::

    with tapped() as tap:
        loader = PrefetchLoader(uri, 10)
    tap.take = lambda read, indices: read(indices)  # a hook: count, wait, fail, or read
    list(loader)
    assert len(tap.takes) == 100
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from lance_prefetch.loader._open import _wrapping_sources

#: A hook: called instead of the source's method, with ``read`` (the wrapped source's own bound
#: method) first and then the call's arguments; it returns what the call returns.
Hook = Callable[..., Any]


class Tap:
    """What a test sees of, and does to, the reads of the sources it wraps (of every reader made
    under :func:`tapped`, in every thread).

    Attributes:
        takes (list[list[int]]): each ``take``'s offsets, in the order the takes started (recorded
            before the hook runs, so a take that the hook fails is recorded too).
        scans (int): ``scan`` calls (a cache's fill, a disk cache's copy, a filter's selection).
        copies (int): ``copy_to`` calls (a disk cache's fills).
        take (Hook | None): ``take(read, indices)`` instead of ``source.take(indices)``.
        scan (Hook | None): ``scan(read, **options)`` instead of ``source.scan(**options)``;
            returns the record batches (an iterator).
        copy_to (Hook | None): ``copy_to(read, path, **options)`` instead of
            ``source.copy_to(path, **options)`` (``read`` copies the rows of a :attr:`scan`).

    Hooks may be set or replaced at any time: the readers hold this tap, not its hooks. Pickles
    without hooks and with empty records (hooks are closures over this process's test): a reader
    copied into a spawn DataLoader worker reads there untapped, and what it reads there is not
    seen here.
    """

    def __init__(
        self, *, take: Hook | None = None, scan: Hook | None = None, copy_to: Hook | None = None
    ) -> None:
        self.take, self.scan, self.copy_to = take, scan, copy_to
        self.takes: list[list[int]] = []
        self.scans = 0
        self.copies = 0
        self._lock = threading.Lock()

    def wrap(self, source: Any) -> TappedSource:
        """``source`` wrapped so that its reads report to this tap (the seam's ``wrap``)."""
        return TappedSource(source, self)

    @contextlib.contextmanager
    def tapping(self) -> Iterator[Tap]:
        """While active, the readers constructed report to this tap (as inside :func:`tapped`)."""
        with _wrapping_sources(self.wrap):
            yield self

    def record(self, what: str, indices: np.ndarray | None = None) -> None:
        """Count one call of ``what`` (``"take"``, ``"scan"`` or ``"copy_to"``)."""
        with self._lock:
            if what == "take":
                self.takes.append(np.asarray(indices).tolist())
            elif what == "scan":
                self.scans += 1
            else:
                self.copies += 1

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


class TappedSource:
    """A ``LanceSource`` whose ``take``, ``scan`` and ``copy_to`` are recorded by ``tap`` and go
    through its hooks; every other public member of ``LanceSource`` is the wrapped source's.
    Pickles as the source and the tap."""

    def __init__(self, inner: Any, tap: Tap) -> None:
        self.inner, self.tap = inner, tap

    def take(self, indices: np.ndarray) -> pa.Table:
        self.tap.record("take", indices)
        hook = self.tap.take
        return self.inner.take(indices) if hook is None else hook(self.inner.take, indices)

    def scan(self, **options: Any) -> Iterator[pa.RecordBatch]:
        self.tap.record("scan")
        hook = self.tap.scan
        return self.inner.scan(**options) if hook is None else hook(self.inner.scan, **options)

    def copy_to(self, path: str, **options: Any) -> None:
        self.tap.record("copy_to")
        hook = self.tap.copy_to
        return self._copy(path, **options) if hook is None else hook(self._copy, path, **options)

    def _copy(self, path: str, **options: Any) -> None:
        """The wrapped source's copy, of the record batches of this wrapper's :meth:`scan` (so a
        scan hook sees, and may slow or fail, the copy's scan too)."""
        self.inner.copy_to(path, scanned=self.scan(), **options)

    # the rest of LanceSource: the wrapped source's
    uri = property(lambda self: self.inner.uri)
    version = property(lambda self: self.inner.version)
    num_rows = property(lambda self: self.inner.num_rows)
    columns = property(lambda self: self.inner.columns)
    schema = property(lambda self: self.inner.schema)
    dataset_schema = property(lambda self: self.inner.dataset_schema)
    committed = property(lambda self: self.inner.committed)
    io = property(lambda self: self.inner.io)
    cached = property(lambda self: self.inner.cached)
    ready = property(lambda self: self.inner.ready)

    def gather(self, indices: np.ndarray) -> Any:
        return self.inner.gather(indices)

    def cached_rows(self, indices: np.ndarray) -> int | None:
        return self.inner.cached_rows(indices)

    def check_offsets(self, indices: np.ndarray) -> None:
        self.inner.check_offsets(indices)

    def check_process(self) -> None:
        self.inner.check_process()

    def prepare(self) -> None:
        self.inner.prepare()

    def options_repr(self) -> dict[str, str] | None:
        return self.inner.options_repr()

    def __repr__(self) -> str:
        return f"TappedSource({self.inner!r})"


@contextlib.contextmanager
def tapped(
    *, take: Hook | None = None, scan: Hook | None = None, copy_to: Hook | None = None
) -> Iterator[Tap]:
    """A :class:`Tap` (with these hooks) over every dataset the readers constructed inside the
    ``with`` open."""
    with Tap(take=take, scan=scan, copy_to=copy_to).tapping() as tap:
        yield tap
