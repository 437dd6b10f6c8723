"""The map-style contenders: a ``Dataset`` whose ``__getitems__`` calls ``take`` (the known
workaround), and :class:`~lance_prefetch.LanceMapDataset` by batch and by row, each under a
persistent spawn ``DataLoader`` whose sampler yields the plan's batches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from lance_prefetch import Dataset
from lance_prefetch.convert import to_tensors
from lance_prefetch_bench._spec import ContenderSpec, open_dataset, plan_batches

__all__ = ["LanceMap", "LanceMapRows", "MapStyle", "TakeDataset"]


class TakeDataset(torch.utils.data.Dataset):
    """The ``map-style`` contender's dataset: ``__getitems__`` is one ``take`` of the whole batch.

    Opens the dataset lazily in each worker process. Each batch is ``to_tensors(table)`` plus
    ``"__take_s__"``: the ``take`` call's duration in seconds (a float64 scalar tensor).
    """

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self._dataset = None

    def __len__(self) -> int:
        return self.spec.num_rows

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        if self._dataset is None:
            self._dataset = open_dataset(self.spec)
        started = time.perf_counter()
        table = self._dataset.take(indices, columns=self.spec.columns)
        took = time.perf_counter() - started
        batch = to_tensors(table)
        batch["__take_s__"] = torch.tensor(took, dtype=torch.float64)
        return batch

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])


class _PlanSampler(torch.utils.data.Sampler[int]):
    """Yields the row offsets of the plan's first ``count`` batches of the current epoch, in order;
    ``BatchSampler(batch_size=B, drop_last=True)`` then cuts exactly the plan's batches."""

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.epoch, self.count = 0, 0

    def __iter__(self) -> Iterator[int]:
        for indices in plan_batches(self.spec, self.epoch, self.count):
            yield from indices.tolist()

    def __len__(self) -> int:
        return self.count * self.spec.batch_size


def _identity(batch: Any) -> Any:
    return batch


class MapStyle:
    """``map-style``: :class:`TakeDataset` under a persistent spawn ``DataLoader`` of
    ``num_workers`` workers, sampled by the plan."""

    notes = (
        "sampler yields the plan's permutation (in place of shuffle=True), so the same batches",
        "persistent_workers=True: the workers start during the warm-up (see setup_s + warmup_s)",
    )

    def __init__(self, spec: ContenderSpec) -> None:
        self.spec = spec
        self.latencies: list[float] = []

    def dataset(self) -> torch.utils.data.Dataset:
        return TakeDataset(self.spec)

    def setup(self) -> None:
        from torch.utils.data import DataLoader

        self.sampler = _PlanSampler(self.spec)
        self.loader = DataLoader(
            self.dataset(),
            batch_size=self.spec.batch_size,
            sampler=self.sampler,
            drop_last=True,
            num_workers=self.spec.num_workers,
            multiprocessing_context="spawn",
            persistent_workers=True,
            collate_fn=_identity,
        )

    def iterate(self, epoch: int, count: int) -> Iterator[tuple[dict, np.ndarray | None]]:
        self.sampler.epoch, self.sampler.count = epoch, count
        planned = plan_batches(self.spec, epoch, count)
        for batch, indices in zip(self.loader, planned, strict=False):
            self.latencies.append(float(batch.pop("__take_s__")))
            yield batch, indices

    def close(self) -> None:
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()


class _TimedMapDataset(torch.utils.data.Dataset):
    """:class:`~lance_prefetch.LanceMapDataset` with each take timed, the duration put into the
    batch as ``"__take_s__"`` (summed over the row takes for ``rows=True``)."""

    def __init__(self, spec: ContenderSpec, *, rows: bool) -> None:
        from lance_prefetch import LanceMapDataset

        self.dataset = LanceMapDataset(
            Dataset(spec.uri, version=spec.version, storage_options=spec.storage_options),
            columns=spec.columns,
        )
        self.rows = rows

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> Any:
        from lance_prefetch import collate

        started = time.perf_counter()
        if self.rows:  # what the DataLoader does without __getitems__: one row at a time
            batch = torch.utils.data.default_collate([self.dataset[i] for i in indices])
        else:
            batch = collate(self.dataset.__getitems__(indices))
        batch["__take_s__"] = torch.tensor(time.perf_counter() - started, dtype=torch.float64)
        return batch


class LanceMap(MapStyle):
    """``lance-map``: :class:`~lance_prefetch.LanceMapDataset`, one take per batch, under the
    same ``DataLoader``."""

    rows = False

    def __init__(self, spec: ContenderSpec) -> None:
        super().__init__(spec)
        self.notes = (
            "rows read one take per row (__getitem__), then the default collate"
            if self.rows
            else "LanceMapDataset: one take per batch (__getitems__), lance_prefetch.collate",
            "take latency = the whole batch's read and conversion in the worker",
        )

    def dataset(self) -> torch.utils.data.Dataset:
        timed = _TimedMapDataset(self.spec, rows=self.rows)
        self.map_dataset = timed.dataset  # its io: the reader (the workers open the same)
        return timed


class LanceMapRows(LanceMap):
    """``lance-map-rows``: the same dataset read row by row, then the default collate."""

    rows = True
