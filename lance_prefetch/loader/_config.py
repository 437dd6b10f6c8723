"""The readers' options, checked once: :class:`SourceOptions`, :class:`LoaderConfig` and
:class:`MapDatasetConfig`, and what a loader's options resolve to once the dataset is known.

Each config is a frozen, keyword-only dataclass whose ``__post_init__`` runs every check that
needs no I/O, cross-field rules included, through :mod:`lance_prefetch._validate`, and stores
the normalised values (a tuple of columns, a plain dict of storage options). The public readers
build one from their keyword arguments; inner code trusts it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lance_prefetch._validate import (
    check_bool,
    check_callable,
    check_choice,
    check_depths,
    check_filter,
    check_folder,
    check_int,
    check_int_or_auto,
    check_rank,
    check_seconds,
    check_seed,
    check_str_mapping,
    check_version,
    check_weights,
)
from lance_prefetch.convert._device import Placement, check_placement
from lance_prefetch.plan._coalesce import TARGET_ROWS, coalesce_size, remote_target, take_memory
from lance_prefetch.plan.permutation import KINDS, resolve_kind
from lance_prefetch.plan.splits import Split
from lance_prefetch.schedule._hedging import HedgePolicy, check_hedge, resolve_hedge
from lance_prefetch.schedule._tuning import START_LEVEL, DepthTuner
from lance_prefetch.schedule.retry import RetryPolicy
from lance_prefetch.sources._options import SourceOptions
from lance_prefetch.sources._uris import remote

__all__ = [
    "DEFAULT_MAX_BUFFER_BYTES",
    "DEFAULT_RETRY",
    "LoaderConfig",
    "MapDatasetConfig",
    "Resolved",
]

#: Default ``max_buffer_bytes``: 256 MiB.
DEFAULT_MAX_BUFFER_BYTES = 256 << 20
#: Default ``retry``: 3 attempts, waits of at most 0.1 s then 0.2 s, no timeout.
DEFAULT_RETRY = RetryPolicy()

_CACHES = ("memory", "disk")
_CACHE_WORDS = {
    "memory": "rows held in this process",
    "disk": "a local copy under cache_dir",
    None: "no cache",
}


@dataclass(frozen=True)
class Resolved:
    """A loader's options resolved against its dataset.

    Attributes:
        coalesce (int): batches read by one ``take``.
        permutation (str): ``"array"``, ``"lazy"`` or ``"identity"`` (``shuffle=False``).
        tuner (DepthTuner | None): the self-tuner with ``readahead``/``max_in_flight="auto"``
            (it learns while reading: one per loader copy), else ``None``.
        hedge (HedgePolicy | None): the hedging every iteration runs (``"auto"`` resolved).
    """

    coalesce: int
    permutation: str
    tuner: DepthTuner | None
    hedge: HedgePolicy | None = None


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Every option of a :class:`~lance_prefetch.PrefetchLoader` but its ``source``, checked.

    The fields are the loader's keyword arguments (see its docstring for each contract), with
    the units in two names: ``log_every_s`` is the loader's ``log_every``. :attr:`source_options`
    is ``columns``, ``version``, ``storage_options`` and ``io`` as a :class:`SourceOptions`;
    :attr:`placement` is ``pin_memory`` and ``device`` resolved.

    Raises:
        TypeError, ValueError: a field has the wrong type or value, or two fields contradict
            each other (``max_in_flight > readahead``, ``coalesce > readahead``, ``cache_bytes``
            or ``cache_dir`` without their cache, ``audit_dir`` without ``audit``, ``rank``
            without ``world_size``, ``device`` unavailable).
    """

    batch_size: int
    columns: Sequence[str] | None = None
    seed: int = 0
    readahead: int | str = "auto"
    max_in_flight: int | str = "auto"
    drop_last: bool | None = None
    shuffle: bool = True
    rank: int | None = None
    world_size: int | None = None
    storage_options: Mapping[str, str] | None = None
    version: int | str | None = None
    transform: Callable[[dict[str, Any]], Any] | None = None
    retry: RetryPolicy | None = DEFAULT_RETRY
    hedge: HedgePolicy | str | None = "auto"
    permutation: str = "auto"
    io: str | None = "auto"
    log_every_s: float | None = None
    coalesce: int | str = "auto"
    cache: str | None = None
    cache_bytes: int | None = None
    cache_dir: str | os.PathLike[str] | None = None
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES
    pin_memory: bool = False
    device: Any = None
    audit: bool = False
    audit_dir: str | os.PathLike[str] | None = None
    filter: str | None = None
    split: Split | None = None
    weights: Sequence[float] | None = None
    source_options: SourceOptions = field(init=False, repr=False, compare=False)
    placement: Placement = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _set(self, "batch_size", check_int("batch_size", self.batch_size, minimum=1))
        _set(self, "seed", check_seed("seed", self.seed))
        _set(self, "readahead", check_int_or_auto("readahead", self.readahead))
        _set(self, "max_in_flight", check_int_or_auto("max_in_flight", self.max_in_flight))
        if isinstance(self.readahead, int) and isinstance(self.max_in_flight, int):
            check_depths(self.readahead, self.max_in_flight)
        _set(
            self,
            "max_buffer_bytes",
            check_int("max_buffer_bytes", self.max_buffer_bytes, minimum=1),
        )
        _set(
            self,
            "cache",
            check_choice("cache", self.cache, _CACHES, none=True, explain=_CACHE_WORDS),
        )
        if self.cache_bytes is not None:
            _set(self, "cache_bytes", check_int("cache_bytes", self.cache_bytes, minimum=1))
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            check_folder("cache_dir", self.cache_dir)  # the TypeError
        if self.cache != "memory" and self.cache_bytes is not None:
            raise ValueError(
                f"cache_bytes={self.cache_bytes} applies to cache='memory' only, but "
                f"cache={self.cache!r}; pass cache='memory' or leave cache_bytes out"
            )
        if self.cache != "disk" and self.cache_dir is not None:
            raise ValueError(
                f"cache_dir applies to cache='disk' only, but cache={self.cache!r}; pass "
                f"cache='disk' or leave cache_dir out"
            )
        _set(self, "shuffle", check_bool("shuffle", self.shuffle))
        if self.drop_last is None:  # full batches to train on; every row once to evaluate
            _set(self, "drop_last", self.shuffle)
        _set(self, "drop_last", check_bool("drop_last", self.drop_last))
        if _check_rank_pair(self.rank, self.world_size):
            _set(self, "rank", int(self.rank))  # type: ignore[arg-type]
            _set(self, "world_size", int(self.world_size))  # type: ignore[arg-type]
        check_callable("transform", self.transform)
        _check_retry(self.retry)
        check_hedge(self.hedge)
        check_choice("permutation", self.permutation, KINDS)
        if not self.shuffle and self.permutation != "auto":
            raise ValueError(
                f"permutation={self.permutation!r} says how a shuffled epoch is held, but "
                f"shuffle=False reads the dataset's own order; leave permutation out"
            )
        _set(
            self,
            "log_every_s",
            check_seconds("log_every", self.log_every_s, positive=True, none_means="no logging"),
        )
        _set(
            self,
            "coalesce",
            check_int_or_auto(
                "coalesce", self.coalesce, expected="'auto' or a number of batches per take >= 1"
            ),
        )
        if isinstance(self.readahead, int):
            coalesce_size(self.coalesce, self.batch_size, self.readahead)  # coalesce <= readahead
        check_folder("cache_dir", self.cache_dir)
        _check_audit(self)
        _set(self, "filter", check_filter(self.filter))
        if self.split is not None and not isinstance(self.split, Split):
            raise TypeError(
                f"split should be a lance_prefetch.Split or None, but got split={self.split!r}; "
                f"e.g. Split(fractions={{'train': 0.9, 'validation': 0.1}}, name='train')"
            )
        _set(self, "placement", check_placement(self.pin_memory, self.device))
        _set(self, "weights", check_weights(self.weights, shuffle=self.shuffle))
        if isinstance(self.storage_options, (list, tuple)):  # one per dataset of a list source
            _set(
                self,
                "storage_options",
                tuple(
                    check_str_mapping(f"storage_options[{i}]", o)
                    for i, o in enumerate(self.storage_options)
                ),
            )
        if isinstance(self.version, (list, tuple)):
            _set(
                self,
                "version",
                tuple(check_version(f"version[{i}]", v) for i, v in enumerate(self.version)),
            )
        listed = isinstance(self.storage_options, tuple) or isinstance(self.version, tuple)
        _set(
            self,
            "source_options",
            SourceOptions(
                columns=self.columns,
                io=self.io,
                version=None if isinstance(self.version, tuple) else self.version,
                storage_options=None
                if isinstance(self.storage_options, tuple)
                else self.storage_options,
            ),
        )
        _set(self, "columns", self.source_options.columns)
        if not listed:
            _set(self, "storage_options", self.source_options.storage_options)

    def per_dataset(self, count: int | None) -> list[SourceOptions]:
        """The :class:`SourceOptions` of each of ``count`` datasets (``None``: ``source`` is one
        dataset): ``storage_options`` and ``version`` either one value for all or a list with
        one per dataset, in the order of ``source``.

        Raises:
            ValueError: a list of another length than ``source``'s, a list for one dataset, or
                ``weights`` without a list of datasets.
        """
        if count is None:
            for name in ("storage_options", "version", "weights"):
                if isinstance(getattr(self, name), tuple):
                    fix = "leave weights out" if name == "weights" else f"one {name} value"
                    raise ValueError(
                        f"{name} is a list, which applies to a list of datasets, but source is "
                        f"one dataset; pass source=[uri_a, uri_b, ...] or {fix}"
                    )
            return [self.source_options]
        for name in ("storage_options", "version", "weights"):
            value = getattr(self, name)
            if isinstance(value, tuple) and len(value) != count:
                raise ValueError(
                    f"{name} lists {len(value)} values, but source lists {count} datasets; "
                    f"give one per dataset, in the order of source"
                    + ("" if name == "weights" else " (or one value for all)")
                )

        def pick(name: str, i: int) -> Any:
            value = getattr(self, name)
            return value[i] if isinstance(value, tuple) else value

        return [
            SourceOptions(
                columns=self.columns,
                io=self.io,
                version=pick("version", i),
                storage_options=pick("storage_options", i),
            )
            for i in range(count)
        ]

    def resolve(self, *, row_bytes: int | None, num_rows: int, uri: str = "") -> Resolved:
        """Coalescing, the permutation kind, the tuner and the hedging for the dataset at ``uri``
        of ``num_rows`` rows of ``row_bytes`` bytes each (``None``: not fixed-width, learnt from
        the first reads)."""
        on_store = remote(uri)
        target = remote_target(num_rows, row_bytes) if on_store else TARGET_ROWS
        if isinstance(self.readahead, int):
            limit = self.readahead
        elif self.coalesce != "auto":  # readahead="auto" makes room for the takes asked for
            limit = int(self.coalesce)
        elif row_bytes:  # "auto": at least two takes within max_buffer_bytes
            limit = max(self.max_buffer_bytes // max(row_bytes * self.batch_size, 1), 1)
        else:  # bytes unknown until the first read: the rule alone
            limit = 2 * target
        coalesce = coalesce_size(self.coalesce, self.batch_size, limit, target=target)
        take_bytes = 0.0
        if row_bytes:  # what one take holds while read, besides its rows
            rows = min(coalesce * self.batch_size, num_rows)
            take_bytes = take_memory(rows, num_rows, row_bytes, remote=on_store)
        tuner = None
        if "auto" in (self.readahead, self.max_in_flight):
            tuner = DepthTuner(
                coalesce=coalesce,
                readahead=self.readahead if isinstance(self.readahead, int) else None,
                max_in_flight=self.max_in_flight if isinstance(self.max_in_flight, int) else None,
                max_buffer_bytes=self.max_buffer_bytes,
                row_bytes=row_bytes,
                batch_size=self.batch_size,
                take_bytes=take_bytes,
                level=START_LEVEL,
            )
        permutation = resolve_kind(self.permutation, num_rows) if self.shuffle else "identity"
        return Resolved(coalesce, permutation, tuner, resolve_hedge(self.hedge, remote=on_store))


@dataclass(frozen=True, kw_only=True)
class MapDatasetConfig:
    """The options of a :class:`~lance_prefetch.LanceMapDataset`, checked.

    Raises:
        TypeError: ``transform`` is not callable, ``retry`` not a ``RetryPolicy``.
        ValueError: ``retry`` has a ``timeout`` (the dataset reads in the worker's own thread,
            where a take cannot be abandoned), or a source option is wrong.
    """

    columns: Sequence[str] | None = None
    storage_options: Mapping[str, str] | None = None
    version: int | str | None = None
    transform: Callable[[Any], Any] | None = None
    retry: RetryPolicy | None = DEFAULT_RETRY
    io: str | None = "auto"
    source_options: SourceOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_callable("transform", self.transform)
        retry = _check_retry(self.retry)
        if retry is not None and retry.timeout is not None:
            raise ValueError(
                f"retry: LanceMapDataset reads in the DataLoader worker's own thread, where a "
                f"take cannot be abandoned, so it takes no timeout (got timeout={retry.timeout:g}); "
                f"use RetryPolicy(timeout=None) and bound each request with "
                f"storage_options['timeout'], or use PrefetchLoader"
            )
        _set(
            self,
            "source_options",
            SourceOptions(
                columns=self.columns,
                version=self.version,
                storage_options=self.storage_options,
                io=self.io,
            ),
        )


def _check_rank_pair(rank: Any, world_size: Any) -> bool:
    """``rank`` and ``world_size`` together or neither; given, ``0 <= rank < world_size``.
    Whether they were given."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass rank and world_size together (or neither, to detect them), but got "
            f"rank={rank!r}, world_size={world_size!r}"
        )
    if rank is not None:
        check_rank(rank, world_size)
    return rank is not None


def _check_audit(config: LoaderConfig) -> None:
    """``audit`` a bool; ``audit_dir`` a folder (as a ``str``), with ``audit=True`` only."""
    _set(config, "audit", check_bool("audit", config.audit))
    if config.audit_dir is None:
        return
    if not config.audit:
        raise ValueError(
            "audit_dir applies to audit=True only (where the coverage audit's records meet), but "
            "audit=False; pass audit=True or leave audit_dir out"
        )
    _set(config, "audit_dir", os.fspath(check_folder("audit_dir", config.audit_dir)))


def _check_retry(retry: Any) -> RetryPolicy | None:
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(
            f"retry should be a lance_prefetch.RetryPolicy or None, but got retry={retry!r}"
        )
    return retry


def _set(config: object, name: str, value: Any) -> None:
    """Store a normalised value in a frozen dataclass (from its ``__post_init__`` only)."""
    object.__setattr__(config, name, value)
