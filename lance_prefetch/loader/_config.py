"""The readers' options, checked once: :class:`LoaderConfig` and :class:`MapDatasetConfig`, and
what a loader's options resolve to once the dataset is known (:class:`Resolved`).

Each config is a frozen, keyword-only dataclass whose ``__post_init__`` runs every check that
needs no I/O, through :mod:`lance_prefetch._validate` and the option groups of
:mod:`lance_prefetch.options`, and stores the normalised values (a tuple of columns, the cache
and audit as their objects). The public readers build one from their keyword arguments; inner
code trusts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lance_prefetch._validate import (
    check_bool,
    check_callable,
    check_choice,
    check_filter,
    check_int,
    check_int_or_auto,
    check_names,
    check_rank,
    check_seconds,
    check_seed,
)
from lance_prefetch.convert._device import Placement, check_placement
from lance_prefetch.options import (
    DEFAULT_RETRY,
    Audit,
    Dataset,
    DiskCache,
    MemoryCache,
    ReadOptions,
    as_audit,
    as_cache,
    as_shuffle,
    check_retry,
)
from lance_prefetch.plan._coalesce import (
    TARGET_ROWS,
    coalesce_size,
    remote_max_level,
    remote_target,
    take_memory,
)
from lance_prefetch.plan.permutation import resolve_kind
from lance_prefetch.plan.splits import Split
from lance_prefetch.schedule._hedging import HedgePolicy, resolve_hedge
from lance_prefetch.schedule._tuning import MAX_LEVEL, START_LEVEL, DepthTuner
from lance_prefetch.schedule.retry import RetryPolicy
from lance_prefetch.sources._options import IO_CHOICES, SourceOptions
from lance_prefetch.sources._uris import remote

__all__ = ["DEFAULT_READ", "LoaderConfig", "MapDatasetConfig", "Resolved"]

#: ``read=None``'s options: every :class:`~lance_prefetch.options.ReadOptions` default.
DEFAULT_READ = ReadOptions()


@dataclass(frozen=True)
class Resolved:
    """A loader's options resolved against its dataset.

    Attributes:
        coalesce (int): batches read by one ``take``.
        permutation (str): ``"array"``, ``"lazy"`` or ``"identity"`` (``shuffle=False``).
        tuner (DepthTuner | None): the self-tuner with ``readahead``/``max_in_flight="auto"``
            (it learns while reading: one per loader copy), else ``None``.
        hedge (HedgePolicy | None): the hedging every iteration runs (``"auto"`` resolved).
        release_memory (bool): glibc's allocator is to return freed buffers
            (``read.release_memory`` on an object store).
    """

    coalesce: int
    permutation: str
    tuner: DepthTuner | None
    hedge: HedgePolicy | None = None
    release_memory: bool = False


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Every option of a :class:`~lance_prefetch.PrefetchLoader` but its ``source``, checked.

    The fields are the loader's keyword arguments (see its docstring for each contract), each
    normalised: ``shuffle`` to a bool with the :class:`~lance_prefetch.options.Shuffle`'s
    ``permutation`` beside it (``"auto"`` when not shuffled), ``cache`` and ``audit`` to their
    objects or ``None``.
    :attr:`placement` is ``pin_memory`` and ``device`` resolved.

    Raises:
        TypeError, ValueError: a field has the wrong type or value, ``device`` is unavailable,
            or ``rank`` is not below a given ``world_size``.
    """

    # typed as normalised (what a reader of the config gets); __post_init__ takes the loader's
    # wider forms (a cache's name, True for Audit(), None for the default ReadOptions)
    batch_size: int
    columns: Sequence[str] | None = None
    filter: str | None = None
    split: Split | None = None
    shuffle: bool = True
    drop_last: bool | None = None
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None
    readahead: int | str = "auto"
    read: ReadOptions = DEFAULT_READ
    cache: MemoryCache | DiskCache | None = None
    transform: Callable[[dict[str, Any]], Any] | None = None
    pin_memory: bool = False
    device: Any = None
    audit: Audit | None = None
    log_every_s: float | None = None
    permutation: str = field(init=False, repr=False, compare=False)
    placement: Placement = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _set(self, "batch_size", check_int("batch_size", self.batch_size, minimum=1))
        _set(self, "columns", check_names("columns", self.columns))
        _set(self, "filter", check_filter(self.filter))
        if self.split is not None and not isinstance(self.split, Split):
            raise TypeError(
                f"split should be a lance_prefetch.Split or None, but got split={self.split!r}; "
                f"e.g. Split(fractions={{'train': 0.9, 'validation': 0.1}}, name='train')"
            )
        shuffle = as_shuffle(self.shuffle)
        _set(self, "shuffle", shuffle is not None)
        _set(self, "permutation", "auto" if shuffle is None else shuffle.permutation)
        if self.drop_last is None:  # full batches to train on; every row once to evaluate
            _set(self, "drop_last", self.shuffle)
        _set(self, "drop_last", check_bool("drop_last", self.drop_last))
        _set(self, "seed", check_seed("seed", self.seed))
        _check_ranks(self)
        _set(self, "readahead", check_int_or_auto("readahead", self.readahead))
        if self.read is None:
            _set(self, "read", DEFAULT_READ)
        if not isinstance(self.read, ReadOptions):
            raise TypeError(
                f"read should be a lance_prefetch.options.ReadOptions, but got read={self.read!r}; "
                f"e.g. read=ReadOptions(max_in_flight=8)"
            )
        _set(self, "cache", as_cache(self.cache))
        check_callable("transform", self.transform)
        _set(self, "placement", check_placement(self.pin_memory, self.device))
        _set(self, "audit", as_audit(self.audit))
        _set(
            self,
            "log_every_s",
            check_seconds("log_every_s", self.log_every_s, positive=True, none_means="no logging"),
        )

    @property
    def max_in_flight(self) -> int | str:
        """``read.max_in_flight``, at most an int ``readahead`` (``"auto"``: tuned)."""
        max_in_flight = self.read.max_in_flight
        if isinstance(self.readahead, int) and isinstance(max_in_flight, int):
            return min(max_in_flight, self.readahead)
        return max_in_flight

    def source_options(self, dataset: Dataset) -> SourceOptions:
        """How to open ``dataset``: its version and storage options, with the loader's
        ``columns`` and reader (``read.io``)."""
        return SourceOptions(
            columns=self.columns,
            io=self.read.io,
            version=dataset.version,
            storage_options=dataset.storage_options,
        )

    def resolve(self, *, row_bytes: int | None, num_rows: int, uri: str = "") -> Resolved:
        """Coalescing, the permutation kind, the tuner and the hedging for the dataset at ``uri``
        of ``num_rows`` rows of ``row_bytes`` bytes each (``None``: not fixed-width, learnt from
        the first reads)."""
        read, on_store = self.read, remote(uri)
        target = remote_target(num_rows, row_bytes) if on_store else TARGET_ROWS
        if isinstance(self.readahead, int):
            limit = self.readahead
        elif read.coalesce != "auto":  # readahead="auto" makes room for the takes asked for
            limit = int(read.coalesce)
        elif row_bytes:  # "auto": at least two takes within max_buffer_bytes
            limit = max(read.max_buffer_bytes // max(row_bytes * self.batch_size, 1), 1)
        else:  # bytes unknown until the first read: the rule alone
            limit = 2 * target
        coalesce = coalesce_size(read.coalesce, self.batch_size, limit, target=target)
        take_bytes = 0.0
        rows = min(coalesce * self.batch_size, num_rows)
        if row_bytes:  # what one take holds while read, besides its rows
            take_bytes = take_memory(
                rows, num_rows, row_bytes, remote=on_store, released=read.release_memory
            )
        tuner = None
        if "auto" in (self.readahead, self.max_in_flight):
            tuner = DepthTuner(
                coalesce=coalesce,
                readahead=self.readahead if isinstance(self.readahead, int) else None,
                max_in_flight=self.max_in_flight if isinstance(self.max_in_flight, int) else None,
                max_buffer_bytes=read.max_buffer_bytes,
                row_bytes=row_bytes,
                batch_size=self.batch_size,
                take_bytes=take_bytes,
                max_level=remote_max_level(rows, num_rows, row_bytes) if on_store else MAX_LEVEL,
                level=START_LEVEL,
            )
        permutation = resolve_kind(self.permutation, num_rows) if self.shuffle else "identity"
        return Resolved(
            coalesce,
            permutation,
            tuner,
            resolve_hedge(read.hedge, remote=on_store),
            release_memory=read.release_memory and on_store,
        )


@dataclass(frozen=True, kw_only=True)
class MapDatasetConfig:
    """The options of a :class:`~lance_prefetch.LanceMapDataset` but its ``source``, checked.

    Raises:
        TypeError: ``columns`` is not a list of names, ``transform`` is not callable, ``retry``
            not a ``RetryPolicy``.
        ValueError: ``retry`` has a ``timeout`` (the dataset reads in the worker's own thread,
            where a take cannot be abandoned), or ``io`` is not one of its choices.
    """

    columns: Sequence[str] | None = None
    transform: Callable[[Any], Any] | None = None
    retry: RetryPolicy | None = DEFAULT_RETRY
    io: str = "auto"

    def __post_init__(self) -> None:
        _set(self, "columns", check_names("columns", self.columns))
        check_callable("transform", self.transform)
        retry = check_retry(self.retry)
        if retry is not None and retry.timeout is not None:
            raise ValueError(
                f"retry: LanceMapDataset reads in the DataLoader worker's own thread, where a "
                f"take cannot be abandoned, so it takes no timeout (got timeout={retry.timeout:g}); "
                f"use RetryPolicy(timeout=None) and bound each request with "
                f"storage_options['timeout'], or use PrefetchLoader"
            )
        _set(self, "io", check_choice("io", self.io, tuple(IO_CHOICES), explain=IO_CHOICES))

    def source_options(self, dataset: Dataset) -> SourceOptions:
        """How to open ``dataset``: its version and storage options, with these ``columns``
        and ``io``."""
        return SourceOptions(
            columns=self.columns,
            io=self.io,
            version=dataset.version,
            storage_options=dataset.storage_options,
        )


def _check_ranks(config: LoaderConfig) -> None:
    """``rank`` an int ``>= 0`` and ``world_size`` an int ``>= 1`` where given (each one not
    given is detected where the loader is used), ``rank < world_size`` when both are."""
    if config.rank is not None:
        _set(config, "rank", check_int("rank", config.rank, minimum=0))
    if config.world_size is not None:
        _set(config, "world_size", check_int("world_size", config.world_size, minimum=1))
    if config.rank is not None and config.world_size is not None:
        check_rank(config.rank, config.world_size)


def _set(config: object, name: str, value: Any) -> None:
    """Store a normalised value in a frozen dataclass (from its ``__post_init__`` only)."""
    object.__setattr__(config, name, value)
