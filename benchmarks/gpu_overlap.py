"""Does the loader keep an accelerator busy? A short check for a machine with one CUDA GPU.

A training step of a few milliseconds (matrix products on the device, sized by ``--step-ms``) is
fed by a :class:`~lance_prefetch.PrefetchLoader` with ``device="cuda"`` and ``pin_memory=True``
over a local synthetic dataset (``id``, 128 x float32 ``vector``, ``label``). It reports:

- the **wait fraction**: the share of the loop's time spent in ``next(loader)``, from the second
  batch on (the time to the first batch is reported on its own);
- the **overlap**: the share of the host-to-device copies' time (from ``torch.profiler``'s CUDA
  activity) that ran while a compute kernel ran;
- whether every batch arrived in the plan's order (``id`` is the row's offset);
- a one-line verdict.

It exits 1 when a batch arrived out of order, or when the wait fraction is above ``--max-wait``
(default 1%) although the step is long enough for the loader to keep up (the loader alone, with
no step, reads a batch in less time than a step takes). ``--device cpu`` runs the same logic
without an accelerator (no copies: the overlap is not measured), which the test suite does::

    python benchmarks/gpu_overlap.py                       # on a CUDA machine, ~1-2 minutes
    python benchmarks/gpu_overlap.py --device cpu --steps 60 --rows 20000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

Interval = tuple[float, float]


def covered(intervals: Iterable[Interval], by: Iterable[Interval]) -> float:
    """Total length of ``intervals`` that lies within the union of ``by`` (both lists of
    ``(start, end)`` with ``start <= end``, any unit, any order)."""
    union: list[list[float]] = []
    for start, end in sorted(by):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    total = 0.0
    for start, end in intervals:
        for u_start, u_end in union:
            if u_start >= end:
                break
            total += max(0.0, min(end, u_end) - max(start, u_start))
    return total


def overlap_share(copies: Sequence[Interval], kernels: Sequence[Interval]) -> float | None:
    """The share of the copies' total time that ran while a compute kernel ran, in ``[0, 1]``;
    ``None`` when there were no copies (or they took no time)."""
    total = sum(end - start for start, end in copies)
    if total <= 0:
        return None
    return min(1.0, covered(copies, kernels) / total)


def verdict(
    *, in_order: bool, wait_fraction: float, max_wait: float, step_s: float, read_s: float
) -> tuple[bool, str]:
    """``(passed, one line)``: out-of-order batches fail; so does a wait fraction above
    ``max_wait`` when the step (``step_s`` a batch) is longer than the loader alone takes to read
    a batch (``read_s``), so that the loader could have kept up."""
    if not in_order:
        return False, "FAIL: batches arrived out of the plan's order"
    allows = step_s > read_s
    if wait_fraction <= max_wait:
        return True, (
            f"PASS: the step waited {wait_fraction:.2%} of the time for batches "
            f"(at most {max_wait:.0%})"
        )
    if allows:
        return False, (
            f"FAIL: the step waited {wait_fraction:.2%} of the time for batches although a step "
            f"({step_s * 1e3:.2f} ms) is longer than the loader takes to read a batch alone "
            f"({read_s * 1e3:.2f} ms)"
        )
    return True, (
        f"PASS (input-bound): the step waited {wait_fraction:.2%}, but a step "
        f"({step_s * 1e3:.2f} ms) is shorter than the loader takes to read a batch alone "
        f"({read_s * 1e3:.2f} ms): nothing could hide that"
    )


class Step:
    """A training step's compute: a linear layer, then ``repeats`` products with a 1024 x 1024
    matrix, on ``device``; :meth:`calibrate` sizes ``repeats`` to about ``step_ms``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.layer = torch.nn.Linear(128, 1024).to(device)
        self.weight = torch.randn(1024, 1024, device=device) / 32
        self.repeats = 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.layer(x))
        for _ in range(self.repeats):
            h = torch.relu(h @ self.weight)
        return h.sum()

    def calibrate(self, step_ms: float, batch_size: int) -> None:
        x = torch.randn(batch_size, 128, device=self.device)
        self(x)  # warm up
        self.repeats = 20
        _sync(self.device)
        started = time.perf_counter()
        self(x)
        _sync(self.device)
        per = (time.perf_counter() - started) / 20
        self.repeats = max(1, round(step_ms / 1e3 / per))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    *, device: str, rows: int, batch_size: int, steps: int, step_ms: float, folder: Path
) -> dict:
    """Write the dataset into ``folder``, measure, and return the figures as a dict."""
    from lance_prefetch import PrefetchLoader
    from lance_prefetch_bench.data import write_synthetic

    target = torch.device(device)
    uri = str(folder / "gpu_overlap.lance")
    write_synthetic(uri, rows)
    # the loader alone: how long a batch takes to read with no step (after the first)
    alone = PrefetchLoader(uri, batch_size, seed=0)
    with alone:
        batches = iter(alone)
        next(batches)
        started = time.perf_counter()
        read = sum(1 for _ in zip(range(steps), batches, strict=False))
        read_s = (time.perf_counter() - started) / max(read, 1)

    step = Step(target)
    step.calibrate(step_ms, batch_size)
    pinned = target.type == "cuda"
    loader = PrefetchLoader(uri, batch_size, seed=0, device=target, pin_memory=pinned)
    expected = [b.indices.tolist() for b in loader.epoch_plan(0).rank_batches(0)][:steps]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if pinned:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    seen: list[list[int]] = []
    waited = first_batch_s = 0.0
    with torch.profiler.profile(activities=activities) as profile:
        started = time.perf_counter()
        batches = iter(loader)
        for _ in range(min(steps, len(expected))):
            before = time.perf_counter()
            batch = next(batches)
            if seen:
                waited += time.perf_counter() - before
            else:  # the time to the first batch is reported on its own
                first_batch_s = time.perf_counter() - before
                started = time.perf_counter()
            seen.append(batch["id"].tolist())
            loss = step(batch["vector"].to(target))
            loss.item()  # the step ends when its result is back, as a logged loss would
        _sync(target)
        elapsed = time.perf_counter() - started
    loader.close()
    copies, kernels = [], []
    for event in profile.events():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        span = (event.time_range.start, event.time_range.end)
        if "Memcpy HtoD" in event.name:
            copies.append(span)
        elif "Memcpy" not in event.name and "Memset" not in event.name:
            kernels.append(span)
    step_s = (elapsed - waited) / max(len(seen) - 1, 1)
    wait_fraction = waited / elapsed if elapsed > 0 else 0.0
    return {
        "device": str(target),
        "batches": len(seen),
        "in_order": seen == expected[: len(seen)],
        "wait_fraction": wait_fraction,
        "overlap": overlap_share(copies, kernels),
        "copies": len(copies),
        "step_ms": step_s * 1e3,
        "read_ms": read_s * 1e3,
        "elapsed_s": elapsed,
        "first_batch_s": first_batch_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check that the loader keeps an accelerator busy (see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--device", default="cuda", help="the device the step runs on")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the dataset")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=400, help="training steps measured")
    parser.add_argument("--step-ms", type=float, default=5.0, help="compute time of a step")
    parser.add_argument("--max-wait", type=float, default=0.01, help="largest wait fraction")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU; pass --device cpu to check the logic")
    with tempfile.TemporaryDirectory() as folder:
        figures = run(
            device=args.device,
            rows=args.rows,
            batch_size=args.batch_size,
            steps=args.steps,
            step_ms=args.step_ms,
            folder=Path(folder),
        )
    passed, line = verdict(
        in_order=figures["in_order"],
        wait_fraction=figures["wait_fraction"],
        max_wait=args.max_wait,
        step_s=figures["step_ms"] / 1e3,
        read_s=figures["read_ms"] / 1e3,
    )
    figures.update(passed=passed, verdict=line)
    overlap = figures["overlap"]
    print(  # noqa: T201
        f"{figures['device']}: {figures['batches']} steps of {figures['step_ms']:.2f} ms, "
        f"wait {figures['wait_fraction']:.2%}, copies overlapped "
        f"{'n/a (no copies)' if overlap is None else f'{overlap:.0%}'}, a batch read alone "
        f"{figures['read_ms']:.2f} ms\n{line}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
