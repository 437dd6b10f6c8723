"""The source stack a loader reads, built in one place: each dataset pinned and projected
(:class:`~lance_prefetch.sources._lance.LanceSource`), cached as the loader asks, mapped to the
rows of its ``filter`` and ``split``, and several datasets concatenated or mixed."""

from __future__ import annotations

import dataclasses
from typing import Any

from lance_prefetch.cache._disk import with_cache
from lance_prefetch.convert import check_schema
from lance_prefetch.loader._config import LoaderConfig
from lance_prefetch.sources._lance import LanceSource, RowSource
from lance_prefetch.sources._multi import ConcatSource, MixtureSource
from lance_prefetch.sources._options import SourceOptions
from lance_prefetch.sources._subset import SubsetSource, select

__all__ = ["check_compatible", "open_source", "open_sources"]


def open_sources(source: Any, config: LoaderConfig) -> RowSource:
    """The source a loader reads: one dataset (:func:`~lance_prefetch.sources._subset.open_source`), or
    a list of them concatenated (with ``weights``: mixed), each opened with its own storage
    options and version, cached and mapped to ``filter``/``split`` on its own.

    Raises:
        ValueError: an empty list, lists of options of another length, ``weights`` for one
            dataset, a dataset without one of the first one's columns, or of another type
            (naming the dataset, the column and both types); the errors of ``open_source``,
            each prefixed with ``source[i]``.
    """
    if not isinstance(source, (list, tuple)):
        config.per_dataset(None)  # lists of options are refused for one dataset
        return open_source(source, config)
    if not source:
        raise ValueError("source is an empty list; give one or more dataset URIs")
    opened: list[RowSource] = []
    for i, options in enumerate(config.per_dataset(len(source))):
        if opened:  # the first dataset's projection, in every dataset
            options = dataclasses.replace(options, columns=opened[0].columns)
        try:
            opened.append(open_source(source[i], config, options=options))
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"source[{i}]: {exc}") from exc
        if i:
            check_compatible(opened[0], opened[i], i)
    concat = ConcatSource(opened)
    return concat if config.weights is None else MixtureSource(concat, config.weights, config.seed)


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
    source: Any, config: LoaderConfig, options: SourceOptions | None = None
) -> RowSource:
    """The source a loader reads: the pinned, projected dataset (its schema checked), with the
    cache ``config`` asks for, and mapped to the rows of its ``filter`` and ``split``
    (``options``: instead of ``config.source_options``, for one of several datasets).
    ``cache="memory"`` holds the selected rows only; ``cache="disk"`` copies the whole version
    (one copy serves every filter and split of it).

    Raises:
        ValueError: the version has no rows; the errors of :func:`select`, of the schema check
            and of the cache's size check.
        Exception: the errors of :class:`~lance_prefetch.sources._lance.LanceSource`.
    """
    lance_source = LanceSource(source, options or config.source_options)
    check_schema(lance_source.schema)
    if lance_source.num_rows == 0:
        raise ValueError(
            f"source: the dataset {lance_source.uri!r} has no rows at version "
            f"{lance_source.version}; write data first or pick another version"
        )
    subset = select(lance_source, config.filter, config.split)
    cache, cache_bytes, cache_dir = config.cache, config.cache_bytes, config.cache_dir
    if subset is None:
        return with_cache(lance_source, cache, cache_bytes=cache_bytes, cache_dir=cache_dir)
    if cache == "memory":
        subset_source = SubsetSource(lance_source, subset)
        return with_cache(subset_source, cache, cache_bytes=cache_bytes)  # type: ignore[arg-type]
    return SubsetSource(with_cache(lance_source, cache, cache_dir=cache_dir), subset)
