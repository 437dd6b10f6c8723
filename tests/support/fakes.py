"""Sources of rows without Lance, for loader-level tests (:class:`FakeSource`), and a wrapper that
makes reads of a real source fail on cue (:class:`FlakySource`). Both implement
``lance_prefetch.sources._lance.RowSource`` explicitly."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa


def ids_table(num_rows: int) -> pa.Table:
    """The rows of the test datasets: ``id`` (int64, = position), ``vector`` (3 x float32 =
    id * [1, 2, 3]) and ``label`` (int64, id % 10)."""
    ids = np.arange(num_rows, dtype=np.int64)
    vector = (ids[:, None] * np.array([1, 2, 3])).astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vector.reshape(-1)), 3),
            "label": ids % 10,
        }
    )


class FakeSource:
    """``num_rows`` rows of :func:`ids_table` held in memory, as the test datasets hold them
    (``id`` = offset). ``take`` checks offsets
    like ``LanceSource.take``, sleeps ``delay_s`` (releasing the GIL, as a read does) and records
    each call's offsets in :attr:`takes`."""

    def __init__(
        self, num_rows: int, *, columns=("id", "vector", "label"), delay_s: float = 0.0
    ) -> None:
        self._table = ids_table(num_rows).select(list(columns))
        self.delay_s = delay_s
        self.takes: list[list[int]] = []
        self._lock = threading.Lock()

    uri = "memory://fake.lance"
    version = 1
    io = "default"
    cached = None
    ready = False

    def gather(self, indices):
        return None

    def cached_rows(self, indices):
        return None

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._table.column_names)

    @property
    def schema(self) -> pa.Schema:
        return self._table.schema

    def take(self, indices: np.ndarray) -> pa.Table:
        self.check_offsets(indices)
        with self._lock:
            self.takes.append(indices.tolist())
        if self.delay_s:
            time.sleep(self.delay_s)
        return self._table.take(pa.array(indices))

    def check_offsets(self, indices: np.ndarray) -> None:
        if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= self.num_rows):
            raise IndexError(f"row offsets must be in [0, {self.num_rows})")

    def check_process(self) -> None:
        pass

    def prepare(self) -> None:
        pass

    def options_repr(self) -> None:
        return None


class FlakySource:
    """Wraps a loader's source (``loader._source = FlakySource(loader._source, ...)``): the first
    attempt to read every ``every``-th distinct batch (in the order reads start) raises ``error``
    (a Lance-style 503 by default) before reading, and its retry reads. ``always``: batches
    (offset arrays) whose every attempt raises. Pickles into workers, where each copy counts its
    own batches."""

    SLOW_DOWN = (
        "LanceError(IO): Generic S3 error: Error performing GET http://store/data/0.lance - "
        "Server returned non-2xx status code: 503 Service Unavailable: <Code>SlowDown</Code>"
    )

    def __init__(self, inner, every: int = 0, *, always=(), error: str = SLOW_DOWN):
        self.inner, self.every, self.error = inner, every, error
        self.always = {indices.tobytes() for indices in always}
        self.batches: dict[bytes, int] = {}  # offsets -> the batch's number, in first-seen order
        self.takes = 0
        self.failures = 0
        self.lock = threading.Lock()

    def take(self, indices):
        key = indices.tobytes()
        with self.lock:
            self.takes += 1
            first = key not in self.batches
            number = self.batches.setdefault(key, len(self.batches) + 1)
            fail = (first and self.every and number % self.every == 0) or key in self.always
            self.failures += fail
        if fail:
            raise OSError(self.error)
        return self.inner.take(indices)

    # the rest of RowSource: the wrapped source's
    uri = property(lambda self: self.inner.uri)
    version = property(lambda self: self.inner.version)
    num_rows = property(lambda self: self.inner.num_rows)
    columns = property(lambda self: self.inner.columns)
    schema = property(lambda self: self.inner.schema)
    io = property(lambda self: self.inner.io)
    cached = property(lambda self: self.inner.cached)
    ready = False  # reads go through take (so that they can fail)

    def gather(self, indices):
        return None

    def cached_rows(self, indices):
        return self.inner.cached_rows(indices)

    def check_offsets(self, indices):
        self.inner.check_offsets(indices)

    def check_process(self):
        self.inner.check_process()

    def prepare(self):
        self.inner.prepare()

    def options_repr(self):
        return self.inner.options_repr()

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.Lock()
