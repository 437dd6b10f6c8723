"""What a contender's process is told to run (:class:`ContenderSpec`), and what every contender
shares: the contender kinds, the epochs of the passes, the dataset and the plan's batches."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lance_prefetch.plan.sampling import EpochPlan

__all__ = [
    "ContenderSpec",
    "DEFAULT_KINDS",
    "KINDS",
    "PEER_KINDS",
    "STEP_EPOCH",
    "SWEPT_KINDS",
    "THROUGHPUT_EPOCH",
    "UNIFORM",
    "WARMUP_EPOCH",
    "close_iterator",
    "open_dataset",
    "plan_batches",
]

#: Every contender, by name (``docs/benchmarks.md`` describes each).
KINDS = (
    "sequential",
    "map-style",
    "lance-torch",
    "ceiling",
    "coalesced-ceiling",
    "scan",
    "lance-prefetch",
    "prefetch-workers",
    "lance-map",
    "lance-map-rows",
    "grain",
    "spdl",
    "lancedb-streaming",
)
#: The peer loaders (the ``peers`` extra): ``--contenders peers`` names them all.
PEER_KINDS = ("grain", "spdl", "lancedb-streaming")
#: What runs without ``--contenders``: the first seven and the peers (a peer not installed is a
#: skipped row saying how to install it).
DEFAULT_KINDS = KINDS[:7] + PEER_KINDS
#: The peer loaders and the seed's map-style loader, each run at every value of its own
#: concurrency knob: (the knob's name, the :class:`ContenderSpec` field it sets).
SWEPT_KINDS = {
    "map-style": ("num_workers", "num_workers"),
    "grain": ("num_threads", "threads"),
    "spdl": ("concurrency", "threads"),
    "lancedb-streaming": ("num_splits", "splits"),
}
#: Whether each contender's batches are uniformly random (every batch a uniform sample of the
#: epoch's rows without replacement), and how.
UNIFORM = {
    **dict.fromkeys(KINDS, "yes"),
    "lance-torch": "no (shuffled contiguous ranges)",
    "scan": "no (sequential scan, disk order)",
    "grain": "yes (its own shuffle)",
    "lancedb-streaming": "yes (its own shuffle)",
}
#: The epochs of the throughput, step and warm-up passes.
THROUGHPUT_EPOCH, STEP_EPOCH, WARMUP_EPOCH = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class ContenderSpec:
    """Everything a contender's process needs (JSON-able; sent as a file).

    Args:
        kind (str): one of :data:`KINDS`.
        uri (str): dataset URI. version (int): the dataset version every contender reads.
        num_rows (int): live rows of that version.
        columns (list[str]): columns to read.
        storage_options (dict[str, str], optional): passed to Lance. Default: ``None``.
        batch_size (int): rows per batch. batches (int): batches per timed pass.
        warmup_batches (int): batches read before timing. Default: ``2``.
        seed (int): seed of every epoch's permutation. Default: ``0``.
        step_ms (float): simulated training step of the step pass, in ms. Default: ``50.0``.
        id_column (str, optional): a column holding row ids; when it is read, the recorded ids
            come from the data, else from the offsets asked for. Default: ``"id"``.
        record_ids (bool): put every id read into the result, not only checksums. Default:
            ``False``.
        readahead (int | str), max_in_flight (int | str): for ``lance-prefetch`` (``"auto"``
            allowed). Default: ``0``.
        coalesce (int | str): ``coalesce`` of ``lance-prefetch``. Default: ``"auto"``.
        cache (str): ``cache`` of ``lance-prefetch``: ``"none"``, ``"memory"`` or ``"disk"`` (in a
            folder of the contender's own, removed afterwards). Default: ``"none"``.
        hedge (str): ``hedge`` of ``lance-prefetch``: ``"auto"`` or ``"none"`` (``None``).
            Default: ``"auto"``.
        io (str): ``ReadOptions.io`` of ``lance-prefetch`` (``"auto"``, ``"default"`` or
            ``"uring"``). Default: ``"auto"``.
        concurrency (list[int]): thread-pool sizes for ``ceiling``; for ``coalesced-ceiling``
            those tried when the loader's ``max_in_flight`` is ``"auto"`` (a fixed one is used
            alone). Default: ``[]``.
        ceiling_repeats (int): runs of ``ceiling`` per pool size. Default: ``2``.
        num_workers (int): DataLoader workers for ``map-style``. Default: ``4``.
        lance_torch_readahead (int): ``batch_readahead`` of ``lance-torch``. Default: ``16``.
        defaults (bool): ``lance-prefetch`` with none of its tuning arguments (its defaults);
            ``readahead``, ``max_in_flight``, ``coalesce`` are then not passed. Default: ``False``.
        threads (int): ``grain``'s ``ReadOptions.num_threads``; ``spdl``'s ``take`` concurrency
            (and its pipeline's threads). Default: ``16``.
        splits (int): ``num_splits`` of ``lancedb-streaming`` (each split reads with its own
            ``io_queue_depth`` of 4 reads in flight). Default: ``1``.
    """

    kind: str
    uri: str
    version: int
    num_rows: int
    columns: list[str]
    storage_options: dict[str, str] | None = None
    batch_size: int
    batches: int
    warmup_batches: int = 2
    seed: int = 0
    step_ms: float = 50.0
    id_column: str | None = "id"
    record_ids: bool = False
    readahead: int | str = 0
    max_in_flight: int | str = 0
    coalesce: int | str = "auto"
    cache: str = "none"
    hedge: str = "auto"
    io: str = "auto"
    concurrency: list[int] = field(default_factory=list)
    ceiling_repeats: int = 2
    num_workers: int = 4
    lance_torch_readahead: int = 16
    defaults: bool = False
    threads: int = 16
    splits: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind should be one of {KINDS}, but got kind={self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-able dict."""
        return asdict(self)


def plan_batches(spec: ContenderSpec, epoch: int, count: int) -> list[np.ndarray]:
    """The row offsets of the first ``count`` batches of ``epoch``'s plan (one rank, full batches)."""
    plan = EpochPlan(
        num_rows=spec.num_rows,
        batch_size=spec.batch_size,
        seed=spec.seed,
        epoch=epoch,
        world_size=1,
        drop_last=True,
    )
    batches = []
    for batch in plan.rank_batches(0):
        if len(batches) == count:
            break
        batches.append(batch.indices)
    return batches


def close_iterator(iterator: Any) -> None:
    """Close a contender's iterator at the end of a pass, if it can be closed (a generator, a
    loader's iterator); others are left to garbage collection."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def open_dataset(spec: ContenderSpec):
    """The spec's dataset, at its pinned version."""
    import lance

    return lance.dataset(spec.uri, version=spec.version, storage_options=spec.storage_options)


def build_loader(spec: ContenderSpec, cache: Any = None) -> Any:
    """The ``PrefetchLoader`` a ``lance-prefetch`` spec describes: its defaults with
    ``spec.defaults`` (no tuning arguments), else the spec's readahead, ``max_in_flight`` and
    ``coalesce``; always rank 0 of 1, the spec's seed, columns, reader and hedging, and
    ``cache``."""
    from lance_prefetch import Dataset, PrefetchLoader, ReadOptions

    hedge = None if spec.hedge == "none" else "auto"
    readahead: int | str = "auto"
    read = ReadOptions(hedge=hedge, io=spec.io)
    if not spec.defaults:
        readahead = spec.readahead
        read = ReadOptions(
            max_in_flight=spec.max_in_flight, coalesce=spec.coalesce, hedge=hedge, io=spec.io
        )
    return PrefetchLoader(
        Dataset(spec.uri, version=spec.version, storage_options=spec.storage_options),
        spec.batch_size,
        columns=spec.columns,
        seed=spec.seed,
        rank=0,
        world_size=1,
        readahead=readahead,
        read=read,
        cache=cache,
    )
