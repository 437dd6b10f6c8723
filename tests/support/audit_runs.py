"""Processes for the coverage audit's tests (tests/test_audit.py): a rank of a real gloo process
group, and a DataLoader ``worker_init_fn`` that injects a fault in one worker. Importable in
spawned and forkserver processes."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

#: The epoch, rank and batch a fault is injected in (``FAULTS[epoch] = (rank, how, k)``): the
#: rank's (or worker's) ``k``-th batch is handed out twice (``"duplicated"``) or not at all
#: (``"dropped"``).
FAULTS = {1: (1, "duplicated", 7), 2: (0, "dropped", 3)}


def faulty(rank: int, faults: dict[int, tuple[int, str, int]]) -> Any:
    """A hand-out seam (``_iteration.deliveries``) that applies the ``faults`` meant for
    ``rank`` (``faults[epoch] = (rank, how, k)``, as :data:`FAULTS`)."""

    def deliveries(batches: Iterator[Any], plan: Any) -> Iterator[Any]:
        target, how, k = faults.get(plan.epoch, (None, None, None))
        for j, batch in enumerate(batches):
            if target == rank and j == k and how == "dropped":
                continue
            yield batch
            if target == rank and j == k and how == "duplicated":
                yield batch

    return deliveries


def inject(rank: int, faults: dict[int, tuple[int, str, int]]) -> None:
    """Install :func:`faulty` in this process (a child process of a test; in the test's own
    process use ``monkeypatch``)."""
    from lance_prefetch.loader import _iteration

    _iteration.deliveries = faulty(rank, faults)


def duplicate_in_worker_1(worker_id: int) -> None:
    """``worker_init_fn``: worker 1 hands its batch 1 out twice in epoch 1."""
    inject(worker_id, {1: (1, "duplicated", 1)})


def gloo_rank(rank: int, uri: str, init_file: str, results: Any) -> None:
    """Rank ``rank`` of 2 in a gloo group: epochs 0 (clean), 1 and 2 (faults of :data:`FAULTS`)
    with a shuffled audited loader, then ranks reading different epochs, then a clean
    ``shuffle=False`` epoch where rank 1 has a batch fewer. Puts ``(rank, outcomes)`` on
    ``results``: per scenario ``("ok", report)`` or ``("error", type name, message, report)``."""
    import torch.distributed as dist

    from lance_prefetch import CoverageError, PrefetchLoader

    outcomes: list[Any] = []
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        inject(rank, FAULTS)
        loader = PrefetchLoader(uri, 10, columns=["id"], drop_last=False, audit=True)
        evaluation = PrefetchLoader(uri, 10, columns=["id"], shuffle=False, audit=True)
        runs = [(loader, 0), (loader, 1), (loader, 2), (loader, 3 + rank), (evaluation, 0)]
        for reader, epoch in runs:
            reader.set_epoch(epoch)
            batches = 0
            try:
                for _ in reader:
                    batches += 1
                outcomes.append(("ok", batches, reader.audit_report))
            except CoverageError as error:
                outcomes.append(("error", batches, str(error), error.report))
        dist.destroy_process_group()
    except BaseException:
        outcomes.append(("crash", traceback.format_exc()))
    results.put((rank, outcomes))


def read_to_end(loader: Any) -> tuple[int, Any]:
    """Batches read to the epoch's end, and the ``CoverageError`` its last ``next()`` raised (or
    ``None``)."""
    from lance_prefetch import CoverageError

    batches = 0
    try:
        for _ in loader:
            batches += 1
    except CoverageError as error:
        return batches, error
    return batches, None
