"""Several datasets read as one: :class:`ConcatSource` (their concatenation) and
:class:`MixtureSource` (a weighted mixture of them); :mod:`lance_prefetch.loader._open` opens
them.

Like a subset (:mod:`lance_prefetch.sources._subset`), the plan stays pure: an epoch permutes positions
``0 .. M-1`` and the source maps them to rows at read time. In a concatenation of datasets with
``m_0, m_1, ...`` rows (each after its own ``filter``/``split``), global position ``p`` is
position ``p - start_i`` of dataset ``i``, where ``start_i = m_0 + ... + m_{i-1} <= p <
start_{i+1}``. A group of positions spanning several datasets is read with one ``take`` per
dataset, in turn (the prefetcher already runs ``max_in_flight`` groups at once), and the rows put
back in the group's order. A mixture maps its ``L`` positions to rows of the concatenation for
each epoch (:mod:`lance_prefetch.plan._mixture`); :func:`epoch_view` gives the loader's reader the
epoch's mapping.

Every dataset is opened, pinned and checked at construction, each with its own storage options
and version; each has its own cache (``cache=``) and filter/split. The projection is the first
dataset's (``columns=None``: all its columns), and every other dataset must hold each of those
columns with the same Arrow type (nullability aside). Pickling carries each dataset's small
source (URI, version, options; a subset's offsets), never an open dataset.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from lance_prefetch.plan._mixture import dataset_seed, epoch_length, mixture_counts
from lance_prefetch.plan.permutation import Permutation, make_permutation
from lance_prefetch.plan.sampling import TooFewRowsError
from lance_prefetch.sources._protocol import OptionsRepr, RowSource
from lance_prefetch.sources._subset import subset_of
from lance_prefetch.sources._wrapped import WrappedSource, check_range

__all__ = ["ConcatSource", "MixtureSource", "epoch_view", "naming_rows"]


class ConcatSource:
    """A :class:`~lance_prefetch.sources._protocol.RowSource` of the rows of ``sources`` one after the
    other: position ``p`` is dataset ``i``'s position ``p - starts[i]``.

    Args:
        sources (Sequence[RowSource]): two or more opened datasets (each maybe cached and mapped
            to its filter/split), with the same projection and Arrow types.

    Attributes:
        sources (tuple[RowSource, ...]): the datasets, in order. starts (numpy.ndarray): where
            each begins, ``int64``, with the total last. uri (str): the URIs joined by ``" + "``
            (messages name the whole). version (tuple[int, ...]): each dataset's pinned version.
    """

    def __init__(self, sources: Sequence[RowSource]) -> None:
        self.sources = tuple(sources)
        self.starts = np.cumsum([0] + [s.num_rows for s in self.sources], dtype=np.int64)
        first = self.sources[0].schema
        #: The first dataset's projected schema, each field nullable if it is in any dataset
        #: (every table read is cast to it: a non-nullable column of one dataset and a nullable
        #: one of another read together).
        self.schema: pa.Schema = pa.schema(
            [
                field.with_nullable(any(s.schema.field(field.name).nullable for s in self.sources))
                for field in first
            ],
            metadata=first.metadata,
        )

    uri = property(lambda self: " + ".join(s.uri for s in self.sources), doc="The URIs.")
    version = property(lambda self: tuple(s.version for s in self.sources), doc="Versions.")
    num_rows = property(lambda self: int(self.starts[-1]), doc="Rows of all datasets.")
    columns = property(lambda self: self.sources[0].columns, doc="The projection.")
    io = property(lambda self: self.sources[0].io, doc="The first dataset's reader.")

    @property
    def cached(self) -> bool | None:
        """``None`` without caches, else whether every dataset's cache is filled."""
        states = [s.cached for s in self.sources]
        return None if all(c is None for c in states) else all(states)

    def cached_rows(self, indices: np.ndarray) -> int | None:
        """``None`` without caches, else the rows at global positions ``indices`` that their
        datasets' caches hold now (a dataset without a cache holds none)."""
        if all(s.cached is None for s in self.sources):
            return None
        _, parts = self._split(indices)
        return sum(self.sources[i].cached_rows(rows) or 0 for i, rows in parts)

    @property
    def ready(self) -> bool:
        """``False``: rows are read by :meth:`take`, one per dataset (its memory cache gathers
        for a loader of that dataset alone)."""
        return False

    def gather(self, indices: np.ndarray) -> None:
        """``None``: rows are read by :meth:`take`."""
        return None

    def datasets(self) -> list[dict[str, Any]]:
        """Each dataset's ``{"uri", "version", "num_rows"}``, in order (what a state records)."""
        return [{"uri": s.uri, "version": s.version, "num_rows": s.num_rows} for s in self.sources]

    def take(self, indices: np.ndarray) -> pa.Table:
        """The rows at global positions ``indices``, in that order: one ``take`` per dataset
        that holds some of them, in turn (its errors as they are), reassembled.

        Raises:
            IndexError: a position outside ``[0, num_rows)`` (before any read).
        """
        self.check_offsets(indices)
        return self.read(indices)

    def read(self, indices: np.ndarray) -> pa.Table:
        """:meth:`take` without the check (positions known to be in range)."""
        which, parts = self._split(indices)
        tables = []
        for i, rows in parts:
            table = self.sources[i].take(rows)
            tables.append(table if table.schema.equals(self.schema) else table.cast(self.schema))
        if len(tables) == 1:
            return tables[0]
        order = np.argsort(which, kind="stable")
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return pa.concat_tables(tables).take(pa.array(inverse))

    def _split(self, indices: np.ndarray) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
        """The dataset of each of global positions ``indices``, and ``(i, rows)`` for each
        dataset ``i`` holding some of them, in dataset order (its rows, in their order)."""
        indices = np.asarray(indices, dtype=np.int64)
        which = np.searchsorted(self.starts, indices, side="right") - 1
        return which, [(int(i), indices[which == i] - self.starts[i]) for i in np.unique(which)]

    def check_offsets(self, indices: np.ndarray) -> None:
        """Refuse positions outside ``[0, num_rows)`` before any read (``IndexError``)."""
        check_range(indices, self.num_rows, what="row positions", of=f"(the rows of {self.uri!r})")

    def check_process(self) -> None:
        """Each dataset's check."""
        for source in self.sources:
            source.check_process()

    def prepare(self) -> None:
        """Each dataset's (a cache fills here)."""
        for source in self.sources:
            source.prepare()

    def options_repr(self) -> OptionsRepr:
        """Each dataset's storage options, secret values hidden."""
        return [source.options_repr() for source in self.sources]


class MixtureSource(ConcatSource):
    """A weighted mixture of ``concat``'s datasets: each epoch is ``length`` positions, of which
    ``counts[i]`` read dataset ``i`` (rules: :mod:`lance_prefetch.plan._mixture`). Read through
    :meth:`for_epoch`; ``take`` itself refuses, since which rows a position reads depends on
    the epoch.

    Args:
        concat (ConcatSource): the datasets. weights (Sequence[float]): normalised, one each.
        seed (int): the loader's seed.
        shuffle (bool): each epoch samples each dataset's rows anew (``True``), or reads the
            first ``counts[i]`` rows of dataset ``i`` in order, the same every epoch.

    Raises:
        ValueError: a weight gives its dataset no row in an epoch (naming ``weights``, the
            dataset and the weight that would give it one).
    """

    def __init__(
        self, concat: ConcatSource, weights: Sequence[float], seed: int, *, shuffle: bool = True
    ) -> None:
        super().__init__(concat.sources)
        self.weights, self.seed, self.shuffle = tuple(weights), seed, shuffle
        self.sizes = [s.num_rows for s in self.sources]
        self.length = epoch_length(self.weights, self.sizes)
        self.counts = mixture_counts(self.weights, self.length)
        if (self.counts == 0).any():
            i = int(np.flatnonzero(self.counts == 0)[0])
            share = self.length * self.weights[i]
            raise ValueError(
                f"weights: source[{i}] ({self.sources[i].uri!r}) would give no row to any "
                f"epoch: weights[{i}] is {self.weights[i]:.3g} of the weights' sum, and an epoch "
                f"of the mixture holds {self.length} rows ({self.length} * "
                f"{self.weights[i]:.3g} = {share:.3g} rows, rounded to 0); raise weights[{i}] to "
                f"at least 1/{self.length} of the weights' sum, or leave source[{i}] out"
            )
        self.blocks = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    num_rows = property(lambda self: self.length, doc="Rows an epoch reads, ``L``.")

    def for_epoch(self, epoch: int) -> _EpochMixture:
        """The source that reads epoch ``epoch``'s positions."""
        return _EpochMixture(self, epoch)

    def take(self, indices: np.ndarray) -> pa.Table:
        """Refused (``RuntimeError``): read through :meth:`for_epoch`."""
        raise RuntimeError("a mixture's rows depend on the epoch: read through for_epoch(epoch)")

    def cached_rows(self, indices: np.ndarray) -> int | None:
        """Refused as :meth:`take` is (the rows behind positions depend on the epoch)."""
        return self.take(indices)  # type: ignore[return-value]

    def samples(self, epoch: int) -> list[Permutation]:
        """Each dataset's permutation in ``epoch``, whose first ``counts[i]`` rows it gives
        (an ``"array"`` one is materialised on first use, once per epoch and process; without
        ``shuffle``, the dataset's own order)."""
        kind = "auto" if self.shuffle else "identity"
        return [
            make_permutation(kind, size, dataset_seed(self.seed, i), epoch)
            for i, size in enumerate(self.sizes)
        ]

    def rows_of(self, samples: Sequence[Permutation], indices: np.ndarray) -> np.ndarray:
        """The concatenation's positions that mixture positions ``indices`` read, with the
        epoch's ``samples`` (:meth:`samples`)."""
        self.check_offsets(indices)
        indices = np.asarray(indices, dtype=np.int64)
        which = np.searchsorted(self.blocks, indices, side="right") - 1
        rows = np.empty_like(indices)
        for i in np.unique(which):
            mask = which == i
            rows[mask] = self.starts[i] + samples[i].take(indices[mask] - self.blocks[i])
        return rows


class _EpochMixture(WrappedSource):
    """A :class:`MixtureSource` bound to one epoch: a RowSource whose ``take`` and
    ``cached_rows`` read that epoch's rows; every other member is the mixture's, forwarded as
    :class:`~lance_prefetch.sources._wrapped.WrappedSource` does (``num_rows`` is an epoch's
    ``L`` positions, ``check_offsets`` refuses positions outside them).

    Args:
        mixture (MixtureSource): the mixture. epoch (int): the epoch read.
    """

    def __init__(self, mixture: MixtureSource, epoch: int) -> None:
        super().__init__(mixture)
        self.mixture, self.epoch = mixture, epoch
        self._samples = mixture.samples(epoch)  # one per dataset, for the whole iteration

    def take(self, indices: np.ndarray) -> pa.Table:
        """The rows of the epoch's positions ``indices``, in that order."""
        return self.mixture.read(self.mixture.rows_of(self._samples, indices))

    def cached_rows(self, indices: np.ndarray) -> int | None:
        """How many of the epoch's positions ``indices`` the datasets' caches hold now."""
        if self.mixture.cached is None:
            return None
        return ConcatSource.cached_rows(self.mixture, self.mixture.rows_of(self._samples, indices))


def epoch_view(source: RowSource, epoch: int) -> RowSource:
    """What reads ``epoch`` from a loader's source: a mixture's epoch, else ``source``."""
    return source.for_epoch(epoch) if isinstance(source, MixtureSource) else source


@contextlib.contextmanager
def naming_rows(source: RowSource) -> Iterator[None]:
    """Within it, a plan's too-few-rows ``ValueError`` names what reads the rows ``source``
    has: a mixture's epoch, a list of datasets, a filter or split of the dataset."""
    try:
        yield
    except TooFewRowsError as exc:
        if isinstance(source, MixtureSource):
            rows = f"an epoch of the mixture of {len(source.sources)} datasets has"
        elif isinstance(source, ConcatSource):
            selected = any(subset_of(each) is not None for each in source.sources)
            datasets = f"the {len(source.sources)} datasets"
            rows = f"the selected rows of {datasets} are" if selected else f"{datasets} have"
        elif (subset := subset_of(source)) is not None:
            rows = f"{subset.describe()} of the dataset's {subset.total_rows} rows selects"
        else:
            raise
        raise TooFewRowsError(exc.needed, exc.num_rows, rows) from None
