"""The source stack a loader reads, built in one place: each dataset pinned and projected
(:class:`~lance_prefetch.sources._lance.LanceSource`), cached as the loader asks, mapped to the
rows of its ``filter`` and ``split``, and several datasets concatenated or mixed.

The seam for tests: every ``LanceSource`` of a dataset that a
:class:`~lance_prefetch.PrefetchLoader` or a :class:`~lance_prefetch.LanceMapDataset` opens is
made by :func:`lance_source`. While ``with _wrapping_sources(wrap):`` is active (in this thread
or any other), it returns ``wrap(source)`` instead: an object with every public member of
``LanceSource`` (the caches call ``scan``, ``copy_to`` and ``committed``; a ``filter`` reads
``dataset_schema``), which the cache, filter, split and mixture layers then wrap as they would
the source itself. The wrap is applied at construction and its result is part of the reader's
source stack: it pickles with the reader (into spawn DataLoader workers too, so it must pickle)
and keeps serving it after the ``with`` ends. The local copy a ``cache="disk"`` opens is not
wrapped: a wrapper sees the dataset's reads only. Private: tests observe and fault a reader's
reads through it (``tests/support/sources.py``) instead of patching ``LanceSource``'s class.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from lance_prefetch import options
from lance_prefetch.cache._disk import with_cache
from lance_prefetch.convert import check_schema
from lance_prefetch.loader._config import LoaderConfig
from lance_prefetch.options import Mixture, as_dataset
from lance_prefetch.sources._lance import LanceSource, RowSource
from lance_prefetch.sources._multi import ConcatSource, MixtureSource
from lance_prefetch.sources._options import SourceOptions
from lance_prefetch.sources._subset import SubsetSource, select

__all__ = ["check_compatible", "lance_source", "open_source", "open_sources"]

#: The wrap of the innermost active :func:`_wrapping_sources` (``None``: none is active).
_wrap: Callable[[LanceSource], LanceSource] | None = None


@contextlib.contextmanager
def _wrapping_sources(wrap: Callable[[LanceSource], LanceSource]) -> Iterator[None]:
    """While active, :func:`lance_source` returns ``wrap(source)`` for every dataset opened (for
    tests only; see the module docstring). Nested: the innermost ``wrap`` applies, the outer one
    again once it ends."""
    global _wrap
    previous, _wrap = _wrap, wrap
    try:
        yield
    finally:
        _wrap = previous


def lance_source(source: Any, how: SourceOptions) -> LanceSource:
    """``LanceSource(source, how)``, or what the active :func:`_wrapping_sources` makes of it.

    Raises:
        Exception: the errors of :class:`~lance_prefetch.sources._lance.LanceSource`.
    """
    opened = LanceSource(source, how)
    return opened if _wrap is None else _wrap(opened)


def open_sources(source: Any, config: LoaderConfig) -> RowSource:
    """The source a loader reads: one dataset (:func:`open_source`), a list of them
    concatenated, or a :class:`~lance_prefetch.options.Mixture` of them; each dataset opened
    with its own storage options and version, cached and mapped to ``filter``/``split`` on its
    own, and read with the first one's columns.

    Raises:
        TypeError: ``source`` (or an item of it) is not a dataset (every item is checked before
            any is opened).
        ValueError: an empty list, a dataset without one of the first one's columns, or of
            another type (naming the dataset, the column and both types); the errors of
            ``open_source``, its ``OSError`` errors included, each prefixed with ``source[i]``.
    """
    if isinstance(source, Mixture):
        datasets, weights = source.datasets, source.weights
    elif isinstance(source, (list, tuple)):
        datasets, weights = tuple(source), None
    else:
        return open_source(source, config)
    if not datasets:
        raise ValueError("source is an empty list; give one or more dataset URIs")
    datasets = tuple(as_dataset(d, name=f"source[{i}]") for i, d in enumerate(datasets))
    opened: list[RowSource] = []
    for i, dataset in enumerate(datasets):
        try:
            opened.append(
                open_source(dataset, config, columns=opened[0].columns if opened else None)
            )
        except (ValueError, TypeError, OSError) as exc:
            raise type(exc)(f"source[{i}]: {str(exc).removeprefix('source: ')}") from exc
        if i:
            check_compatible(opened[0], opened[i], i)
    concat = ConcatSource(opened)
    if weights is None:
        return concat
    return MixtureSource(concat, weights, config.seed, shuffle=config.shuffle)


def check_compatible(first: RowSource, other: RowSource, index: int) -> None:
    """Refuse dataset ``index`` if a column has another Arrow type than in the first dataset.

    Raises:
        ValueError: naming the dataset, the column and both types.
    """
    for name in first.columns:
        mine, theirs = first.schema.field(name).type, other.schema.field(name).type
        if mine != theirs:
            raise ValueError(
                f"source[{index}] ({other.uri!r} version {other.version}): column {name!r} is "
                f"{theirs} there but {mine} in source[0] ({first.uri!r}); every dataset must "
                f"hold the columns read with the same type: cast it (e.g. with "
                f"LanceDataset.alter_columns), or leave it out of columns"
            )


def open_source(
    source: Any, config: LoaderConfig, *, columns: tuple[str, ...] | None = None
) -> RowSource:
    """One dataset as a loader reads it: pinned and projected (its schema checked), with the
    cache ``config`` asks for, and mapped to the rows of its ``filter`` and ``split``
    (``columns``: instead of ``config.columns``, for the second and later of several
    datasets). A memory cache holds the selected rows only; a disk cache copies the whole
    version (one copy serves every filter and split of it).

    Raises:
        TypeError: ``source`` is not a dataset.
        ValueError: the version has no rows; the errors of :func:`select`, of the schema check
            and of the cache's size check.
        Exception: the errors of :class:`~lance_prefetch.sources._lance.LanceSource`.
    """
    dataset = as_dataset(source)
    how = config.source_options(dataset)
    if columns is not None:
        how = dataclasses.replace(how, columns=columns)
    opened = lance_source(dataset.uri, how)
    check_schema(opened.schema)
    if opened.num_rows == 0:
        raise ValueError(
            f"source: the dataset {opened.uri!r} has no rows at version "
            f"{opened.version}; write data first or pick another version"
        )
    subset = select(opened, config.filter, config.split)
    if subset is None:
        return _cached(opened, config.cache)
    if isinstance(config.cache, options.MemoryCache):  # the selected rows only
        return _cached(SubsetSource(opened, subset), config.cache)  # type: ignore[arg-type]
    return SubsetSource(_cached(opened, config.cache), subset)


def _cached(
    source: LanceSource, cache: options.MemoryCache | options.DiskCache | None
) -> RowSource:
    """``source`` itself (no cache) or the cache ``cache`` describes over it."""
    if isinstance(cache, options.MemoryCache):
        return with_cache(source, "memory", cache_bytes=cache.max_bytes)
    if isinstance(cache, options.DiskCache):
        return with_cache(source, "disk", cache_dir=cache.dir)
    return source
