"""What one benchmark run measures: :class:`BenchConfig`, checked once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lance_prefetch_bench._spec import DEFAULT_KINDS, KINDS
from lance_prefetch_bench.latency_proxy import Latency

__all__ = ["BenchConfig", "SWEEP_GRID"]

_LOCAL_SCHEMES = ("", "file", "file+uring")
_AUTO = ("readahead", "max_in_flight", "coalesce")  # the settings that may be "auto"
_IO = ("auto", "default", "uring")  # ReadOptions.io

#: The ``lance-prefetch`` grid of ``--sweep-loader`` (each entry replaces the bench's default for
#: that setting; ``io_grid`` only on local datasets): two depths, two in-flight bounds, the
#: ``coalesce`` rule and one take a batch, Lance's default reader and ``io="auto"``.
SWEEP_GRID: dict[str, tuple[int | str, ...]] = {
    "readahead": (8, 64),
    "max_in_flight": (4, 16),
    "coalesce": ("auto", 1),
    "io_grid": ("auto", "default"),
}


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What one benchmark run does.

    Args:
        uri (str, optional): the dataset to read. Default: ``None``: write a synthetic dataset of
            ``rows`` rows (see :func:`~lance_prefetch_bench.data.write_synthetic`) to a temporary
            folder, or to the emulated S3 with ``local_s3``, and remove it afterwards.
        local_s3 (bool): emulate S3 on 127.0.0.1 (nginx + rclone + latency proxy); needs
            ``uri=None``. Default: ``False``.
        rows (int): rows of the synthetic dataset. Default: ``20000``.
        rows_per_file (int): rows per fragment of the synthetic dataset. Default: ``5000``.
        storage_options (dict[str, str]): passed to Lance. Default: ``{}``.
        columns (tuple[str, ...], optional): columns to read. Default: ``None``, all.
        batch_size (int): rows per batch. Default: ``256``.
        batches (int): batches per timed pass (capped at the batches of one epoch). Default: ``48``.
        warmup_batches (int): untimed batches before the passes. Default: ``2``.
        seed (int): seed of every epoch's permutation. Default: ``0``.
        step_ms (float): simulated training step of the step pass, in ms. Default: ``50.0``.
        readahead (tuple[int | str, ...]): the ``lance-prefetch`` grid's readahead values; ``"auto"``
            adds one setting with ``readahead="auto", max_in_flight="auto"``. Default:
            ``(1, 4, 16, 64)``.
        max_in_flight (tuple[int, ...]): its max_in_flight values; pairs with
            ``max_in_flight > readahead`` are skipped. Default: ``(1, 4, 16)``.
        coalesce (tuple[int | str, ...]): the grid's ``coalesce`` values. Default: ``("auto",)``.
        cache (tuple[str, ...]): the grid's ``cache`` values, among ``"none"``, ``"memory"``,
            ``"disk"`` (a disk cache lives in the run's temporary folder). Default:
            ``("none",)``.
        io (tuple[str, ...]): the grid's ``ReadOptions.io`` values (``"auto"``, ``"default"``,
            ``"uring"``; a setting names ``io`` only when it is not ``"auto"``). Default:
            ``("auto",)``.
        hedge (tuple[str, ...]): the grid's ``hedge`` values: ``"auto"`` (the loader's
            default: hedged takes on object stores) and ``"none"`` (``hedge=None``). Default:
            ``("auto",)``.
        repeats (int): runs of each contender setting but ``ceiling`` (which has
            ``ceiling_repeats``) and peers that are not installed, each in its own process, in
            interleaved rounds (every setting once per round, the order rotated by one each
            round, so slow spells of the machine spread over the settings); the report keeps
            each setting's median run and its spread (see
            :func:`~lance_prefetch_bench.verdicts.merge_rounds`). Default: ``1``.
        ceiling_concurrency (tuple[int, ...]): thread-pool sizes tried by ``ceiling``. Default:
            ``(4, 16, 64)``.
        ceiling_repeats (int): runs of ``ceiling`` per pool size; the best counts. Default: ``2``.
        coalesced_ceiling_concurrency (tuple[int, ...]): thread-pool sizes tried by
            ``coalesced-ceiling`` (the loader's defaults have ``max_in_flight="auto"``, which
            moves within such a range). Default: ``(2, 4, 8, 16)``.
        map_workers (tuple[int, ...]): DataLoader workers of each ``map-style`` setting (and of
            ``lance-map``, ``lance-map-rows``). Default: ``(2, 4)``.
        grain_threads (tuple[int, ...]): ``ReadOptions.num_threads`` of each ``grain`` setting.
            Default: ``(4, 16, 64)`` (16: Grain's default; 64 for object stores).
        spdl_concurrency (tuple[int, ...]): ``take`` concurrency of each ``spdl`` setting.
            Default: ``(4, 16, 64)``.
        streaming_splits (tuple[int, ...]): ``num_splits`` of each ``lancedb-streaming`` setting.
            Default: ``(1, 2, 4)`` (1: its default for one process). Each of these four is a
            sweep: the report names the setting with the most rows/s
            (:func:`~lance_prefetch_bench.verdicts.sweep_winners`).
        contenders (tuple[str, ...]): which contenders to run. Default:
            :data:`~lance_prefetch_bench._spec.DEFAULT_KINDS` (the first five and the peers). With
            ``lance-prefetch``, its defaults (no tuning arguments) run too, as
            ``lance-prefetch defaults``.
        latency (Latency): latency added by the emulated S3. Default: ``Latency()``.
        aimd_rate (int): pins Lance's request-rate limiter on object stores
            (``lance_aimd_initial_rate`` = ``lance_aimd_max_rate``, requests/s) unless the storage
            options set it; ``0`` leaves Lance's default (a ramp). Default: ``5000``.
        io (str): ``"uring"``: every contender reads a local dataset through Lance's io_uring
            reader (its ``file+uring://`` URI); ``"default"``: the URI as it is. Default:
            ``"default"``.
        io_threads (int, optional): ``LANCE_IO_THREADS`` for the contenders. Default: ``None``
            (the environment's value, else Lance's default).
        id_column (str, optional): column with row ids for the same-ids check. Default: ``"id"``.
        record_ids (bool): store every id read in the JSON, not only checksums. Default: ``False``.
        out_dir (Path): where the JSON, Markdown and PNG go. Default: ``bench-results``.
        name (str): their file name, without suffix. Default: ``"bench"``.
        contender_timeout_s (float): a contender running longer is stopped and reported as
            failed. Default: ``300``.
        progress (bool): show a progress bar on stderr. Default: ``True``.
        targets (bool): add the development targets (met or missed) to the report. Default:
            ``False``.
        sweep_loader (bool): the report compares ``lance-prefetch defaults`` with the best
            setting of the grid (:func:`~lance_prefetch_bench.verdicts.defaults_vs_best`); the
            command's ``--sweep-loader`` also runs only the loader, over a grid of its own
            (:data:`SWEEP_GRID`). Default: ``False``.

    Raises:
        ValueError: a value is out of range, ``local_s3`` with a ``uri``, an unknown contender, or
            an empty ``lance-prefetch`` grid.
    """

    uri: str | None = None
    local_s3: bool = False
    rows: int = 20_000
    rows_per_file: int = 5_000
    storage_options: dict[str, str] = field(default_factory=dict)
    columns: tuple[str, ...] | None = None
    batch_size: int = 256
    batches: int = 48
    warmup_batches: int = 2
    seed: int = 0
    step_ms: float = 50.0
    readahead: tuple[int | str, ...] = (1, 4, 16, 64)
    max_in_flight: tuple[int | str, ...] = (1, 4, 16)
    coalesce: tuple[int | str, ...] = ("auto",)
    io_grid: tuple[str, ...] = ("auto",)
    hedge: tuple[str, ...] = ("auto",)
    cache: tuple[str, ...] = ("none",)
    repeats: int = 1
    ceiling_concurrency: tuple[int, ...] = (4, 16, 64)
    ceiling_repeats: int = 2
    coalesced_ceiling_concurrency: tuple[int, ...] = (2, 4, 8, 16)
    map_workers: tuple[int, ...] = (2, 4)
    grain_threads: tuple[int, ...] = (4, 16, 64)
    spdl_concurrency: tuple[int, ...] = (4, 16, 64)
    streaming_splits: tuple[int, ...] = (1, 2, 4)
    contenders: tuple[str, ...] = DEFAULT_KINDS
    latency: Latency = field(default_factory=Latency)
    aimd_rate: int = 5000
    io: str = "default"
    io_threads: int | None = None
    id_column: str | None = "id"
    record_ids: bool = False
    out_dir: Path = Path("bench-results")
    name: str = "bench"
    contender_timeout_s: float = 300.0
    progress: bool = True
    targets: bool = False
    sweep_loader: bool = False

    def __post_init__(self) -> None:
        if self.local_s3 and self.uri is not None:
            raise ValueError(
                f"--local-s3 writes its own dataset to the emulated S3, so give no URI "
                f"(got {self.uri!r}); to read your own dataset from S3, pass its URI and "
                f"--storage-option KEY=VALUE"
            )
        if isinstance(self.map_workers, int):  # one value: a sweep of one
            object.__setattr__(self, "map_workers", (self.map_workers,))
        for name in (
            "rows",
            "rows_per_file",
            "batch_size",
            "batches",
            "ceiling_repeats",
            "repeats",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} should be >= 1, but got {name}={getattr(self, name)}")
        for name in ("warmup_batches", "seed", "aimd_rate"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} should be >= 0, but got {name}={getattr(self, name)}")
        if self.io not in ("default", "uring"):
            raise ValueError(f"io should be 'default' or 'uring', but got io={self.io!r}")
        if self.io == "uring" and (self.local_s3 or _scheme(self.uri or "") not in _LOCAL_SCHEMES):
            raise ValueError("--io uring reads local datasets only (io_uring is for local files)")
        if self.step_ms < 0:
            raise ValueError(f"step_ms should be >= 0, but got step_ms={self.step_ms}")
        unknown = [name for name in self.contenders if name not in KINDS]
        if unknown or not self.contenders:
            raise ValueError(f"contenders should be among {list(KINDS)}, but got {unknown or '[]'}")
        for name in (
            "readahead",
            "max_in_flight",
            "coalesce",
            "ceiling_concurrency",
            "coalesced_ceiling_concurrency",
            "map_workers",
            "grain_threads",
            "spdl_concurrency",
            "streaming_splits",
        ):
            values = getattr(self, name)
            numbers = [v for v in values if v != "auto" or name not in _AUTO]
            if not values or any(not isinstance(v, int) or v < 1 for v in numbers):
                raise ValueError(
                    f"{name} should be integers >= 1 (or 'auto'), but got {list(values)}"
                )
        if not self.cache or any(c not in ("none", "memory", "disk") for c in self.cache):
            raise ValueError(
                f"cache should be among 'none', 'memory', 'disk', but got {list(self.cache)}"
            )
        if not self.io_grid or any(io not in _IO for io in self.io_grid):
            raise ValueError(f"io_grid should be among {list(_IO)}, but got {list(self.io_grid)}")
        if "uring" in self.io_grid and (
            self.local_s3 or _scheme(self.uri or "") not in _LOCAL_SCHEMES
        ):
            raise ValueError("io_grid: 'uring' reads local datasets only (io_uring is local)")
        if not self.hedge or any(h not in ("auto", "none") for h in self.hedge):
            raise ValueError(f"hedge should be among 'auto', 'none', but got {list(self.hedge)}")
        if "lance-prefetch" in self.contenders and not self.grid():
            raise ValueError(
                f"no lance-prefetch setting has max_in_flight <= readahead: readahead="
                f"{list(self.readahead)}, max_in_flight={list(self.max_in_flight)}"
            )

    def grid(self) -> list[tuple[int | str, int | str]]:
        """The ``(readahead, max_in_flight)`` pairs to run, ``max_in_flight <= readahead``, and
        ``("auto", "auto")`` when ``readahead`` or ``max_in_flight`` holds ``"auto"``."""
        readaheads = sorted({v for v in self.readahead if v != "auto"})
        mifs = sorted({v for v in self.max_in_flight if v != "auto"})
        pairs: list[tuple[int | str, int | str]] = [
            (readahead, mif) for mif in mifs for readahead in readaheads if mif <= readahead
        ]
        if "auto" in self.readahead or "auto" in self.max_in_flight:
            pairs.append(("auto", "auto"))
        return pairs

    def prefetch_settings(self) -> list[dict[str, Any]]:
        """Every ``lance-prefetch`` setting: the :meth:`grid` times ``coalesce`` times ``cache``
        times ``hedge`` times ``io_grid`` (a setting names ``hedge`` and ``io`` only when they
        are not ``"auto"``)."""
        return [
            {"readahead": r, "max_in_flight": m, "coalesce": c, "cache": cache}
            | ({} if hedge == "auto" else {"hedge": hedge})
            | ({} if io == "auto" else {"io": io})
            for io in dict.fromkeys(self.io_grid)
            for hedge in dict.fromkeys(self.hedge)
            for cache in dict.fromkeys(self.cache)
            for c in dict.fromkeys(self.coalesce)
            for r, m in self.grid()
        ]


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else ""
