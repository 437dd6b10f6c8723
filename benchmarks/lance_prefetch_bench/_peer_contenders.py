"""The peer loaders as contenders (the ``peers`` extra: Grain, SPDL, LanceDB), each driven the way
its documentation shows, reading batches with one ``take`` each where it can.

==========================  ===========================================================================
contender                   what it runs
==========================  ===========================================================================
``grain``                   a ``grain.python.RandomAccessDataSource`` over the dataset (``__getitems__``:
                            one ``take`` per index batch) under ``MapDataset.range(rows)
                            .shuffle(seed + epoch).batch(B, drop_remainder=True).map(read)
                            .to_iter_dataset(ReadOptions(num_threads=threads))``: Grain's own global
                            index shuffle, so not the plan's batches
``spdl``                    ``spdl.pipeline.PipelineBuilder``: the plan's index batches -> ``take``
                            (``concurrency=threads``, ``output_order="input"``) -> ``to_tensors`` ->
                            sink; the same batches as the other contenders
``lancedb-streaming``       ``lancedb.streaming.StreamingDataset(table, num_splits=splits,
                            shuffle_seed=seed, epoch=epoch)`` under ``DataLoader(batch_size=B)``: rows
                            of its own permutation (built for each epoch by a scan), read 64 at a time
==========================  ===========================================================================
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from lance_prefetch.convert import to_tensors
from lance_prefetch_bench._spec import ContenderSpec, close_iterator, open_dataset, plan_batches

__all__ = [
    "Grain",
    "GrainSource",
    "INSTALL_HINT",
    "LanceDBStreaming",
    "PEER_MODULES",
    "Spdl",
    "lancedb_table",
    "missing_peer",
]

#: The module each peer contender imports, and its package.
PEER_MODULES = {"grain": "grain", "spdl": "spdl.pipeline", "lancedb-streaming": "lancedb"}
#: How to install the peers (they need torch installed first, so no extra installs them).
INSTALL_HINT = (
    "install the peers after torch: pip install 'lance-prefetch-bench[peers]' "
    "(in a checkout: pip install -e 'benchmarks[peers]')"
)


def missing_peer(kind: str) -> str | None:
    """``None`` if ``kind`` is not a peer or its package is installed, else the one line that
    says what is missing and how to install it."""
    module = PEER_MODULES.get(kind)
    if module is None:
        return None
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        found = False
    if found:
        return None
    return f"{kind} needs {module.split('.')[0]}, which is not installed: {INSTALL_HINT}"


class _Timed:
    """Appends each ``take``'s duration to ``latencies`` (``list.append`` is thread-safe)."""

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.latencies: list[float] = []

    def take(self, indices: Any) -> Any:
        started = time.perf_counter()
        table = self.dataset.take(np.asarray(indices, dtype=np.int64), columns=self.spec.columns)
        self.latencies.append(time.perf_counter() - started)
        return table


class GrainSource(_Timed):
    """A ``grain.python.RandomAccessDataSource`` over the spec's dataset: ``__getitem__`` reads one
    row, ``__getitems__`` one batch (a single ``take``), as a ``pyarrow.Table``."""

    def __init__(self, spec: ContenderSpec) -> None:
        super().__init__(spec)
        self.dataset = open_dataset(spec)

    def __len__(self) -> int:
        return self.spec.num_rows

    def __getitem__(self, index: int) -> Any:
        return self.take([index])

    def __getitems__(self, indices: Any) -> Any:
        return self.take(indices)

    def __repr__(self) -> str:
        return f"GrainSource({self.spec.uri!r}, version={self.spec.version})"


class Grain:
    """``grain``: Grain's global index shuffle, each index batch read by one ``take``."""

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.notes = (
            "Grain's global index shuffle (MapDataset.shuffle, seed + epoch): uniform, but not "
            "the plan's batches; the index batches, one take each, through "
            "RandomAccessDataSource.__getitems__",
        )

    @property
    def latencies(self) -> list[float]:
        return self.source.latencies

    def setup(self) -> None:
        self.source = GrainSource(self.spec)

    def batches(self, epoch: int, count: int) -> Any:
        """The first ``count`` batches of ``epoch`` as Grain yields them: (tensors, indices)."""
        import grain.python as grain

        spec = self.spec

        def read(indices: np.ndarray) -> tuple[dict, np.ndarray]:
            return to_tensors(self.source.__getitems__(indices)), indices

        dataset = (
            grain.MapDataset.range(spec.num_rows)
            .shuffle(seed=spec.seed + epoch)
            .batch(spec.batch_size, drop_remainder=True)
        )
        dataset = dataset.slice(slice(0, count)).map(read)  # no reads past the pass
        return dataset.to_iter_dataset(grain.ReadOptions(num_threads=spec.threads))

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        iterator = iter(self.batches(epoch, count))
        try:
            yield from iterator
        finally:
            close_iterator(iterator)

    def close(self) -> None:
        pass


class Spdl(_Timed):
    """``spdl``: the plan's batches through an SPDL pipeline (source -> take -> convert -> sink)."""

    notes = (
        "the plan's index batches as the source; the take stage's concurrency is the setting "
        "(and the pipeline's threads), output_order=\"input\" (the plan's order; SPDL's "
        "default is completion order); a sink buffer of as many batches",
    )

    def setup(self) -> None:
        self.dataset = open_dataset(self.spec)

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        from spdl.pipeline import PipelineBuilder

        threads = self.spec.threads

        def read(indices: np.ndarray) -> tuple[Any, np.ndarray]:
            return self.take(indices), indices

        def convert(item: tuple[Any, np.ndarray]) -> tuple[dict, np.ndarray]:
            return to_tensors(item[0]), item[1]

        pipeline = (
            PipelineBuilder()
            .add_source(plan_batches(self.spec, epoch, count))
            .pipe(read, concurrency=threads, output_order="input")
            .pipe(convert)
            .add_sink(threads)
            .build(num_threads=threads)
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=120)

    def close(self) -> None:
        pass


def _rows(batch: Any) -> list[dict]:
    """A ``StreamingDataset`` transform: one Arrow batch -> its rows as dicts of tensors."""
    import pyarrow as pa

    tensors = to_tensors(pa.Table.from_batches([batch]))
    return [{name: value[i] for name, value in tensors.items()} for i in range(batch.num_rows)]


def lancedb_table(spec: ContenderSpec) -> Any:
    """The spec's dataset as a LanceDB table at its version (``DIR/NAME.lance`` is table ``NAME``
    of the database ``DIR``; a ``file+uring://`` URI is read as a plain path)."""
    import lancedb

    uri = spec.uri.removeprefix("file+uring://").rstrip("/")
    directory, _, name = uri.rpartition("/")
    if not name.endswith(".lance"):
        raise ValueError(
            f"lancedb-streaming needs a dataset URI ending in .lance, got {spec.uri!r}"
        )
    db = lancedb.connect(directory or ".", storage_options=spec.storage_options)
    table = db.open_table(name.removesuffix(".lance"))
    table.checkout(spec.version)
    return table


class LanceDBStreaming:
    """``lancedb-streaming``: LanceDB's ``StreamingDataset`` of rows under a ``DataLoader``."""

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.latencies: list[float] = []  # stays empty: its reads run inside LanceDB's threads
        self.notes = (
            "its own permutation (a uniform shuffle into num_splits splits, rows taken round-robin "
            "from the splits), not the plan's batches; built by a scan at each epoch's start "
            "(inside first batch); rows read 64 at a time (read_batch_size), 4 reads in flight "
            "a split; rows as dicts of tensors collated by the DataLoader; take latency not "
            "measured",
        )

    def setup(self) -> None:
        self.table = lancedb_table(self.spec)

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        from lancedb.streaming import StreamingDataset
        from torch.utils.data import DataLoader

        spec = self.spec
        dataset = StreamingDataset(
            self.table,
            num_splits=spec.splits,
            shuffle_seed=spec.seed,
            epoch=epoch,
            columns=list(spec.columns),
            transform=_rows,
        )
        iterator = iter(DataLoader(dataset, batch_size=spec.batch_size, drop_last=True))
        try:
            for _ in range(count):
                batch = next(iterator, None)
                if batch is None:
                    return
                yield batch, None
        finally:
            fetcher = getattr(iterator, "_dataset_fetcher", None)
            rows = getattr(fetcher, "dataset_iter", None)
            if rows is not None:  # stop its read threads now, not when collected
                rows.close()

    def close(self) -> None:
        pass
