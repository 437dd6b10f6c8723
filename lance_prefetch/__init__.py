"""lance-prefetch: fully random batches from Lance datasets, read concurrently ahead of training.

The public surface is :class:`PrefetchLoader` (a ``torch.utils.data.IterableDataset``),
:class:`BatchLoadError`, :class:`RetryPolicy`, :class:`LoaderStats` (from ``loader.stats()``) and :func:`state_from_dataloader`, and for PyTorch's own samplers the
map-style :class:`LanceMapDataset` with its :func:`collate`. The modules underneath each do one job:
:mod:`~lance_prefetch.sampling` (which rows in which batch), :mod:`~lance_prefetch.permutation`
(each epoch's order, materialised or computed lazily), :mod:`~lance_prefetch.epochs` (which
epoch each iteration reads, across processes), :mod:`~lance_prefetch.state` (checkpoint state),
:mod:`~lance_prefetch.scheduling` (concurrent fetches, bounded readahead),
:mod:`~lance_prefetch.coalesce` (several batches per ``take``),
:mod:`~lance_prefetch.tuning` (``readahead="auto"``),
:mod:`~lance_prefetch.cache` (``cache="memory"``/``"disk"``: epochs served from one scan),
:mod:`~lance_prefetch.retry` (which read errors are retried, and how),
:mod:`~lance_prefetch.telemetry` (rows/s, waiting, take latency),
:mod:`~lance_prefetch.source` (Lance I/O), :mod:`~lance_prefetch.convert` (Arrow to torch),
:mod:`~lance_prefetch.mapstyle` (the map-style dataset) and
:mod:`~lance_prefetch.cli` (the ``lance-prefetch`` command).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from .dataset import BatchLoadError as BatchLoadError
from .dataset import PrefetchLoader as PrefetchLoader
from .mapstyle import LanceMapDataset as LanceMapDataset
from .mapstyle import collate as collate
from .retry import RetryPolicy as RetryPolicy
from .state import state_from_dataloader as state_from_dataloader
from .telemetry import LoaderStats as LoaderStats

try:
    __version__ = _version("lance-prefetch")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "BatchLoadError",
    "LanceMapDataset",
    "LoaderStats",
    "PrefetchLoader",
    "RetryPolicy",
    "__version__",
    "collate",
    "state_from_dataloader",
]
assert sorted(__all__) == __all__
