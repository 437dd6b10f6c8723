"""lance-prefetch: fully random batches from Lance datasets, read concurrently ahead of training.

The public surface is :class:`PrefetchLoader` (a ``torch.utils.data.IterableDataset``) with its
option groups from :mod:`~lance_prefetch.options` (:class:`Dataset` and :class:`Mixture`, what to
read; :class:`ReadOptions`, how; :class:`Shuffle`, :class:`MemoryCache`, :class:`DiskCache` and
:class:`Audit`), :class:`BatchLoadError`, :class:`RetryPolicy`, :class:`HedgePolicy` (hedged
takes, ``ReadOptions(hedge=...)``),
:class:`LoaderStats` (from ``loader.stats()``),
:class:`CoverageError` and :class:`AuditReport` (the coverage audit, ``audit=True``),
:class:`Split` (one part of a seeded train/validation split, ``split=``),
:func:`state_from_dataloader`, and for PyTorch's own samplers the map-style
:class:`LanceMapDataset` with its :func:`collate`. The public modules are the rule books:
:mod:`~lance_prefetch.plan.sampling` (which rows in which batch), :mod:`~lance_prefetch.plan.permutation`
(each epoch's order), :mod:`~lance_prefetch.plan.splits` (which rows form which part of a split),
:mod:`~lance_prefetch.convert` (Arrow to torch),
:mod:`~lance_prefetch.state` (checkpoint state), :mod:`~lance_prefetch.schedule.retry` (which read
errors are retried, and how) and :mod:`~lance_prefetch.convert.tokens` (padding and packing token
sequences). The machinery lives in private modules; ``docs/design.md`` maps them.
"""

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from lance_prefetch._errors import BatchLoadError as BatchLoadError
from lance_prefetch._errors import CoverageError as CoverageError
from lance_prefetch.audit._coverage import AuditReport as AuditReport
from lance_prefetch.loader._telemetry import LoaderStats as LoaderStats
from lance_prefetch.options import Audit as Audit
from lance_prefetch.options import Dataset as Dataset
from lance_prefetch.options import DiskCache as DiskCache
from lance_prefetch.options import MemoryCache as MemoryCache
from lance_prefetch.options import Mixture as Mixture
from lance_prefetch.options import ReadOptions as ReadOptions
from lance_prefetch.options import Shuffle as Shuffle
from lance_prefetch.plan.splits import Split as Split
from lance_prefetch.schedule._hedging import HedgePolicy as HedgePolicy
from lance_prefetch.schedule.retry import RetryPolicy as RetryPolicy
from lance_prefetch.state import state_from_dataloader as state_from_dataloader

if TYPE_CHECKING:
    from lance_prefetch.loader._loader import PrefetchLoader as PrefetchLoader
    from lance_prefetch.loader._mapstyle import LanceMapDataset as LanceMapDataset
    from lance_prefetch.loader._mapstyle import collate as collate

# The readers import torch and Lance: they load on first use, so that the rule books (sampling,
# permutation, state, retry) and the scheduling machinery import without them.
_READERS = {
    "PrefetchLoader": ".loader._loader",
    "LanceMapDataset": ".loader._mapstyle",
    "collate": ".loader._mapstyle",
}


def __getattr__(name: str) -> Any:
    module = _READERS.get(name)
    if module is None:
        raise AttributeError(f"module 'lance_prefetch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_READERS})


try:
    __version__ = _version("lance-prefetch")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "Audit",
    "AuditReport",
    "BatchLoadError",
    "CoverageError",
    "Dataset",
    "DiskCache",
    "HedgePolicy",
    "LanceMapDataset",
    "LoaderStats",
    "MemoryCache",
    "Mixture",
    "PrefetchLoader",
    "ReadOptions",
    "RetryPolicy",
    "Shuffle",
    "Split",
    "__version__",
    "collate",
    "state_from_dataloader",
]
assert sorted(__all__) == __all__
