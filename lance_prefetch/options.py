"""The option groups of :class:`~lance_prefetch.PrefetchLoader` and
:class:`~lance_prefetch.LanceMapDataset`: frozen dataclasses that check themselves when built.

What to read:

- :class:`Dataset`: one dataset with its own ``version`` and ``storage_options`` (a plain URI,
  path or ``lance.LanceDataset`` is ``Dataset(uri)``);
- :class:`Mixture`: several datasets read in proportions (a plain list concatenates them).

How to read and keep it:

- :class:`ReadOptions`: the read tuning (``max_in_flight``, ``coalesce``, ``max_buffer_bytes``,
  ``io``, ``retry``, ``hedge``);
- :class:`Shuffle`: how a shuffled epoch's permutation is held (``shuffle=True`` is
  ``Shuffle()``);
- :class:`MemoryCache` and :class:`DiskCache`: where batches come from after the first read
  (``cache="memory"`` and ``cache="disk"`` are their defaults);
- :class:`Audit`: the coverage audit (``audit=True`` is ``Audit()``).

Each option lives in exactly one place, so no option is valid only with another's value: a
disk cache's folder is a field of :class:`DiskCache`, a dataset's version a field of
:class:`Dataset`, a mixture's weights a field of :class:`Mixture`. Every check runs in
``__post_init__``, before any I/O, and raises ``TypeError`` or ``ValueError`` naming the field
and the fix. ``docs/api.md`` shows each group in use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from lance_prefetch._validate import (
    check_bool,
    check_choice,
    check_folder,
    check_int,
    check_int_or_auto,
    check_str_mapping,
    check_version,
    check_weights,
)
from lance_prefetch.plan.permutation import KINDS
from lance_prefetch.schedule._hedging import HedgePolicy, check_hedge
from lance_prefetch.schedule.retry import RetryPolicy
from lance_prefetch.sources._options import IO_CHOICES
from lance_prefetch.sources._storage import redact, redact_uri

if TYPE_CHECKING:
    import lance

__all__ = [
    "Audit",
    "DEFAULT_MAX_BUFFER_BYTES",
    "DEFAULT_RETRY",
    "Dataset",
    "DatasetLike",
    "DiskCache",
    "MemoryCache",
    "Mixture",
    "ReadOptions",
    "Shuffle",
    "as_audit",
    "as_cache",
    "as_dataset",
    "as_shuffle",
]

#: Default :attr:`ReadOptions.max_buffer_bytes`: 256 MiB.
DEFAULT_MAX_BUFFER_BYTES = 256 << 20
#: Default :attr:`ReadOptions.retry`: 3 attempts, waits of at most 0.1 s then 0.2 s, no timeout.
DEFAULT_RETRY = RetryPolicy()

#: What a dataset may be given as: a URI or local path, an open ``lance.LanceDataset``, or a
#: :class:`Dataset`.
DatasetLike: TypeAlias = "str | os.PathLike[str] | lance.LanceDataset | Dataset"


@dataclass(frozen=True)
class Dataset:
    """One Lance dataset, as ``lance.dataset(uri, version=..., storage_options=...)`` opens it.

    Pass it as a loader's ``source``, or as an item of a list ``source`` or of a
    :class:`Mixture` to give that dataset its own version and storage options. A plain URI,
    path or ``lance.LanceDataset`` stands for ``Dataset(uri)``.

    Args:
        uri (str | os.PathLike | lance.LanceDataset): the dataset's URI (``s3://``, ``gs://``,
            ``az://``, ``file+uring://``), local path, or an open dataset.
        version (int | str, optional): the version number (``>= 1``) or tag to read; the
            loader pins it (with an open dataset, its checked-out version is replaced).
            Default: ``None``, the latest version at construction.
        storage_options (Mapping[str, str], optional): passed to Lance as they are (object
            store credentials, endpoint, region, ``timeout``). Default: ``None``.

    Raises:
        TypeError: ``uri`` is not a ``str``, ``os.PathLike`` or ``lance.LanceDataset``; a
            ``version`` or ``storage_options`` of the wrong type.
        ValueError: a ``version`` below 1 or an empty tag.
    """

    uri: str | os.PathLike[str] | lance.LanceDataset
    version: int | str | None = None
    storage_options: Mapping[str, str] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.uri, (str, os.PathLike)) and not _is_lance_dataset(self.uri):
            raise TypeError(
                f"Dataset: uri should be a dataset URI (str or os.PathLike) or a "
                f"lance.LanceDataset, but got {type(self.uri).__name__}"
            )
        if isinstance(self.uri, (str, os.PathLike)) and not os.fspath(self.uri):
            raise ValueError("Dataset: uri should be a dataset URI or path, but got ''")
        _set(self, "version", check_version("version", self.version))
        _set(
            self,
            "storage_options",
            check_str_mapping("storage_options", self.storage_options),
        )

    def __repr__(self) -> str:
        """The fields as given, with secret storage option values (keys, tokens, passwords) and
        credentials in the URI hidden, as the loader prints them."""
        uri = redact_uri(self.uri) if isinstance(self.uri, str) else self.uri
        return (
            f"Dataset(uri={uri!r}, version={self.version!r}, "
            f"storage_options={redact(self.storage_options)!r})"
        )


@dataclass(frozen=True)
class Mixture:
    """Several datasets mixed in proportions: each epoch reads ``weights[i]`` of its rows from
    ``datasets[i]``, as many rows as keep every dataset within its own rows
    (``docs/datasets.md`` gives the rules). With ``shuffle=True`` each epoch samples each
    dataset's share anew and interleaves them uniformly; with ``shuffle=False`` an epoch reads
    the first rows of each dataset's share, dataset after dataset, the same every epoch.

    Args:
        datasets (Sequence[DatasetLike]): two or more datasets (URIs, paths, open datasets or
            :class:`Dataset` items); the first one's columns are read from all.
        weights (Sequence[float]): one finite number ``> 0`` per dataset, in the order of
            ``datasets``; normalised to sum to 1.

    Raises:
        TypeError: ``datasets`` or ``weights`` is not a list, or an item has the wrong type.
        ValueError: fewer than two datasets, another number of weights, or a weight that is
            not finite or ``<= 0``.
    """

    datasets: Sequence[DatasetLike]
    weights: Sequence[float]

    def __post_init__(self) -> None:
        if isinstance(self.datasets, (str, bytes, os.PathLike)) or not isinstance(
            self.datasets, Sequence
        ):
            raise TypeError(
                f"Mixture: datasets should be a list of datasets, but got {self.datasets!r}; "
                f"e.g. Mixture(['s3://bucket/a.lance', 's3://bucket/b.lance'], weights=[0.7, 0.3])"
            )
        datasets = tuple(as_dataset(d, name=f"datasets[{i}]") for i, d in enumerate(self.datasets))
        if len(datasets) < 2:
            raise ValueError(
                f"Mixture: datasets should list at least two datasets, but got {len(datasets)}; "
                f"pass one dataset as source directly"
            )
        if self.weights is None:
            raise TypeError(
                "Mixture: weights should be a list of numbers, one per dataset, but got None; "
                "e.g. Mixture([uri_a, uri_b], weights=[0.7, 0.3]), or a plain list of datasets "
                "to read them whole, one after the other"
            )
        weights = check_weights(self.weights)
        assert weights is not None  # given (checked above)
        if len(weights) != len(datasets):
            raise ValueError(
                f"Mixture: weights lists {len(weights)} values, but datasets lists "
                f"{len(datasets)}; give one weight per dataset, in the order of datasets"
            )
        _set(self, "datasets", datasets)
        _set(self, "weights", weights)


@dataclass(frozen=True)
class ReadOptions:
    """How the loader reads: concurrency, take sizes, memory, reader, retries and hedging.

    Args:
        max_in_flight (int | "auto"): takes running at once, at most ``readahead`` (a larger
            number means ``readahead``). ``"auto"``: tuned while reading, from 4, at most 64 on
            local files and 4 on object stores (8 where a take's rows are too far apart to share
            requests). Default: ``"auto"``.
        coalesce (int | "auto"): batches read by one ``take`` (their rows sorted and read
            together), at most ``readahead``. ``"auto"``: enough batches for about 4,096 rows
            on local disk and larger takes on object stores. Default: ``"auto"``.
        max_buffer_bytes (int): bytes of read-ahead batches the tuner (``"auto"``) keeps at
            most, ``>= 1``. Default: 256 MiB.
        io ("auto" | "default" | "uring"): Lance's reader: ``"uring"`` is its io_uring reader
            (local files only), ``"default"`` its usual one, ``"auto"`` io_uring for local
            files where the kernel allows it. Default: ``"auto"``.
        retry (RetryPolicy | None): which read errors are retried and how; ``None``: never.
            Default: ``RetryPolicy()``.
        hedge (HedgePolicy | "auto" | None): hedged takes (a second take for one much slower
            than its peers). ``"auto"``: ``HedgePolicy()`` on object stores, none on local
            files. Default: ``"auto"``.
        release_memory (bool): on object stores, make glibc's ``malloc`` give the large
            buffers Lance frees back to the system (``mallopt``: a fixed 128 KiB mmap threshold
            and at most 2 arenas, as ``MALLOC_MMAP_THRESHOLD_=131072 MALLOC_ARENA_MAX=2`` do),
            once per process as the first iteration starts, so that the process's memory stays
            flat over a long run. Process-wide; a setting made by those environment variables is
            kept; no effect on local files or with another C library. ``False``: leave the
            allocator as it is. Default: ``True``.

    Raises:
        TypeError, ValueError: a field of the wrong type or out of range (the message names it).
    """

    max_in_flight: int | Literal["auto"] = "auto"
    coalesce: int | Literal["auto"] = "auto"
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES
    io: Literal["auto", "default", "uring"] = "auto"
    retry: RetryPolicy | None = DEFAULT_RETRY
    hedge: HedgePolicy | Literal["auto"] | None = "auto"
    release_memory: bool = True

    def __post_init__(self) -> None:
        _set(self, "max_in_flight", check_int_or_auto("max_in_flight", self.max_in_flight))
        _set(
            self,
            "coalesce",
            check_int_or_auto(
                "coalesce", self.coalesce, expected="'auto' or a number of batches per take >= 1"
            ),
        )
        _set(
            self,
            "max_buffer_bytes",
            check_int("max_buffer_bytes", self.max_buffer_bytes, minimum=1),
        )
        _set(self, "io", check_choice("io", self.io, tuple(IO_CHOICES), explain=IO_CHOICES))
        check_retry(self.retry)
        check_hedge(self.hedge)
        _set(self, "release_memory", check_bool("release_memory", self.release_memory))


@dataclass(frozen=True)
class Shuffle:
    """A shuffled epoch: a new uniform permutation of the rows each epoch (``shuffle=True`` is
    ``Shuffle()``).

    Args:
        permutation ("auto" | "array" | "lazy"): how the permutation is held. ``"array"``: a
            NumPy array of the rows' offsets (``num_rows`` times 1 to 8 bytes); ``"lazy"``: a
            keyed bijection computed per position (a few bytes, a little CPU per row);
            ``"auto"``: ``"array"`` up to 2**27 rows, else ``"lazy"``. The two kinds give
            different orders for one seed. Default: ``"auto"``.

    Raises:
        ValueError: another ``permutation``.
    """

    permutation: Literal["auto", "array", "lazy"] = "auto"

    def __post_init__(self) -> None:
        check_choice("permutation", self.permutation, KINDS)


@dataclass(frozen=True)
class MemoryCache:
    """Keep the rows read in this process's memory: the first epoch reads the dataset once
    (every selected row, in order), later epochs gather batches from memory. Workers and ranks
    each hold their own copy (``docs/caching.md``).

    Args:
        max_bytes (int, optional): refuse at construction (``ValueError``) a dataset whose
            selected rows take more bytes than this (estimated from the fixed-width columns
            and, otherwise, from Lance's statistics). Default: ``None``, half of this
            machine's physical memory, or of its control group's (container's) memory limit
            where that is lower.

    Raises:
        TypeError, ValueError: ``max_bytes`` is not an integer ``>= 1``.
    """

    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_bytes is not None:
            _set(self, "max_bytes", check_int("max_bytes", self.max_bytes, minimum=1))


@dataclass(frozen=True)
class DiskCache:
    """Copy the dataset's pinned version to a local folder once (shared by processes through a
    file lock) and read every epoch from the copy: fixed-width columns (numbers, bools,
    fixed-size lists, tensors) are raw files each process memory-maps, so a batch of them is a
    gather from the page cache; other columns are a local Lance dataset read by ``take``
    (``docs/guide.md``, "Caches").

    Args:
        dir (str | os.PathLike, optional): the folder that holds the copies (one per dataset
            and version); a leading ``~`` is expanded and a relative path made absolute here
            (so a later ``os.chdir`` does not move it). Default: ``None``,
            ``$LANCE_PREFETCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/lance-prefetch``, else
            ``~/.cache/lance-prefetch``.

    Raises:
        TypeError: ``dir`` is not a ``str`` or ``os.PathLike``.
        ValueError: ``dir`` is empty, or it (or its nearest existing ancestor) is not a folder.
    """

    dir: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if self.dir is not None:
            _set(self, "dir", _folder(type(self), self.dir))


@dataclass(frozen=True)
class Audit:
    """The coverage audit: each epoch read to its end is checked to have delivered every row
    of the epoch exactly once, over all ranks and workers (``docs/audit.md``); a gap or
    repeat raises :class:`~lance_prefetch.CoverageError` (``audit=True`` is ``Audit()``).

    Args:
        dir (str | os.PathLike, optional): a folder all ranks and workers can write, where
            their records meet (needed with DataLoader workers, or ranks without a process
            group); a leading ``~`` is expanded and a relative path made absolute here, as
            ``DiskCache(dir=...)`` does. Default: ``None``, through the process group.

    Raises:
        TypeError: ``dir`` is not a ``str`` or ``os.PathLike``.
        ValueError: ``dir`` is empty, or it (or its nearest existing ancestor) is not a folder.
    """

    dir: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if self.dir is not None:
            _set(self, "dir", _folder(type(self), self.dir))


def as_dataset(value: Any, *, name: str = "source") -> Dataset:
    """``value`` as a :class:`Dataset` (a URI, path or open dataset wrapped as it is).

    Raises:
        TypeError: another type, naming ``name``.
    """
    if isinstance(value, Dataset):
        return value
    if isinstance(value, (str, os.PathLike)) or _is_lance_dataset(value):
        return Dataset(value)
    raise TypeError(
        f"{name} should be a dataset URI (str or os.PathLike), a lance.LanceDataset or a "
        f"lance_prefetch.options.Dataset, but got {type(value).__name__}"
    )


def as_cache(value: Any) -> MemoryCache | DiskCache | None:
    """``cache`` as its object: ``"memory"`` is ``MemoryCache()``, ``"disk"`` ``DiskCache()``.

    Raises:
        TypeError, ValueError: anything but ``None``, those words and the two types.
    """
    if value is None or isinstance(value, (MemoryCache, DiskCache)):
        return value
    if value == "memory":
        return MemoryCache()
    if value == "disk":
        return DiskCache()
    error = ValueError if isinstance(value, str) else TypeError
    raise error(
        f"cache should be None, 'memory', 'disk', a MemoryCache or a DiskCache, but got "
        f"cache={value!r}; e.g. cache=MemoryCache(max_bytes=8 << 30) or "
        f"cache=DiskCache(dir='/scratch/cache')"
    )


def as_audit(value: Any) -> Audit | None:
    """``audit`` as its object: ``True`` is ``Audit()``, ``False`` and ``None`` no audit.

    Raises:
        TypeError: anything but a bool, ``None`` or an :class:`Audit`.
    """
    if value is None or value is False:
        return None
    if value is True:
        return Audit()
    if isinstance(value, Audit):
        return value
    raise TypeError(
        f"audit should be True, False or a lance_prefetch.options.Audit, but got audit={value!r}; "
        f"e.g. audit=Audit(dir='/shared/audit') with DataLoader workers"
    )


def as_shuffle(value: Any) -> Shuffle | None:
    """``shuffle`` as its object: ``True`` is ``Shuffle()``, ``False`` no shuffling (``None``).

    Raises:
        TypeError: anything but a bool or a :class:`Shuffle`.
    """
    if isinstance(value, Shuffle):
        return value
    if value is True:
        return Shuffle()
    if value is False:
        return None
    raise TypeError(
        f"shuffle should be True, False or a lance_prefetch.options.Shuffle, but got "
        f"shuffle={value!r}"
    )


def check_retry(retry: Any) -> RetryPolicy | None:
    """``retry``: a :class:`~lance_prefetch.RetryPolicy` or ``None``.

    Raises:
        TypeError: anything else.
    """
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(
            f"retry should be a lance_prefetch.RetryPolicy or None, but got retry={retry!r}"
        )
    return retry


def _in(owner: type, check: Callable[[str, Any], Any], name: str, value: Any) -> Any:
    """``check(name, value)``, its error prefixed with the option class (``"DiskCache: "``)."""
    try:
        return check(name, value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{owner.__name__}: {exc}") from None


def _is_lance_dataset(value: Any) -> bool:
    """Whether ``value`` is a ``lance.LanceDataset`` (without importing Lance here)."""
    return any(
        cls.__name__ == "LanceDataset" and cls.__module__.startswith("lance")
        for cls in type(value).__mro__
    )


def _folder(owner: type, path: Any) -> str:
    """The ``dir`` option of ``owner`` checked as a folder (:func:`check_folder`, its error
    prefixed with the class) after ``~`` is expanded and a non-empty path made absolute (anything
    else as it is, for the check to name it)."""
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if isinstance(text, str) and text and "\x00" not in text:
            path = os.path.abspath(os.path.expanduser(text))
    folder: str | os.PathLike[str] = _in(owner, check_folder, "dir", path)
    return os.fspath(folder)


def _set(options: object, name: str, value: Any) -> None:
    """Store a normalised value in a frozen dataclass (from its ``__post_init__`` only)."""
    object.__setattr__(options, name, value)
