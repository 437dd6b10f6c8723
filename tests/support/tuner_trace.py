"""A recorded trace of the self-tuner's decisions on synthetic inputs.

:func:`simulate` drives a ``DepthTuner`` through its public interface (``observe`` every
simulated batch, ``restart`` between iterations) with seeded, noisy measurements whose rows/s
and wait depend on the level handed out, and returns every decision. ``tests/data/tuner_trace.json``
holds the decisions of the tuner as it was before its phases were named; ``test_tuning`` replays
the same inputs and compares, decision by decision. Run this file to record the trace again
(only when a change of decisions is intended).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

TRACE = Path(__file__).resolve().parent.parent / "data" / "tuner_trace.json"

#: (name, tuner options, model): the model gives the best level, the rows/s per take in flight,
#: the noise (a fraction of rows/s), the batch size, whether a training step hides reads and
#: (optionally) the step's pace as a fraction of the best level's rows/s (default 0.8) and a
#: noise of the wait, as a fraction of the step (default 0).
SCENARIOS = [
    (
        "plateau-at-8",
        dict(coalesce=1, readahead=None, max_in_flight=None),
        (8, 1000.0, 0.15, 100, False),
    ),
    (
        "cpu-bound-noisy",
        dict(coalesce=4, readahead=None, max_in_flight=None),
        (2, 4000.0, 0.25, 64, False),
    ),
    (
        "behind-a-step",
        dict(coalesce=2, readahead=None, max_in_flight=None),
        (6, 800.0, 0.10, 256, True),
    ),
    (
        "fixed-readahead",
        dict(coalesce=2, readahead=24, max_in_flight=None),
        (16, 500.0, 0.10, 128, False),
    ),
    (
        "fixed-in-flight",
        dict(coalesce=1, readahead=None, max_in_flight=3),
        (32, 300.0, 0.20, 100, False),
    ),
    (
        "byte-cap-learnt",
        dict(
            coalesce=1, readahead=None, max_in_flight=None, row_bytes=None, max_buffer_bytes=1 << 20
        ),
        (64, 200.0, 0.10, 512, False),
    ),
    (
        "start-at-1",
        dict(coalesce=8, readahead=None, max_in_flight=None, level=1),
        (4, 2000.0, 0.20, 128, True),
    ),
    (
        "over-supplied",
        dict(coalesce=1, readahead=None, max_in_flight=None),
        (8, 1000.0, 0.10, 100, True, 0.3),
    ),
    (
        "near-the-edge",
        dict(coalesce=2, readahead=None, max_in_flight=None),
        (4, 1000.0, 0.30, 100, True, 0.95),
    ),
    (
        "mild-waits",
        dict(coalesce=1, readahead=None, max_in_flight=None),
        (8, 1000.0, 0.10, 100, True, 0.3, 0.022),
    ),
    (
        "calm-band",
        dict(coalesce=1, readahead=None, max_in_flight=None),
        (8, 1000.0, 0.10, 100, True, 0.3, 0.005),
    ),
]


def simulate(tuner_class, name: str, options: dict, model: tuple, *, seed: int = 0) -> list:
    """Decisions of ``tuner_class`` in one scenario: a list of ``[time, readahead,
    max_in_flight, why]`` (``why``: ``"observe"`` or ``"restart"``)."""
    best, per_take, noise, batch_size, hidden, *rest = model
    demand_fraction = rest[0] if rest else 0.8
    wait_noise = rest[1] if len(rest) > 1 else 0.0
    settings = dict(
        max_buffer_bytes=1 << 30, row_bytes=100.0, batch_size=batch_size, level=4, period_s=1.0
    )
    settings.update(options)
    tuner = tuner_class(**settings)
    rng = random.Random(f"{name}-{seed}")
    decisions = []
    bounds = tuner.restart()
    decisions.append([0.0, bounds.readahead, bounds.max_in_flight, "restart"])
    now = 0.0
    for iteration in range(4):
        waited, rows, read = 0.0, 0, 0
        for _ in range(1500 if iteration < 3 else 6000):
            level = bounds.max_in_flight
            supply = per_take * min(level, best) * (1 + rng.uniform(-noise, noise))
            demand = demand_fraction * per_take * best if hidden else float("inf")
            rate = min(supply, demand)
            step = batch_size / rate
            if hidden:  # the loop waits when reads fall short of the step's pace
                wait = max(0.0, batch_size / supply - batch_size / demand) + rng.uniform(
                    0, 1e-4 + wait_noise * step
                )
            else:
                wait = step * (0.9 + rng.uniform(-0.05, 0.05))
            now += step
            waited += wait
            rows += batch_size
            read += batch_size
            answer = tuner.observe(now, waited, rows, read * 100, read)
            if answer is not None:
                bounds = answer
                decisions.append([round(now, 6), bounds.readahead, bounds.max_in_flight, "observe"])
        bounds = tuner.restart()
        decisions.append([round(now, 6), bounds.readahead, bounds.max_in_flight, "restart"])
    return decisions


def fuzz(tuner_class, seed: int, periods: int = 4000) -> list:
    """Decisions of ``tuner_class`` fed whole periods of random waits (calm, small, near the
    threshold, urgent) and rows/s that depend on the level by a curve that changes now and then,
    with a restart every 500 periods: ``[period, readahead, max_in_flight]`` per change."""
    rng = random.Random(f"fuzz-{seed}")
    tuner = tuner_class(
        coalesce=rng.choice([1, 2, 4]),
        readahead=None,
        max_in_flight=None,
        max_buffer_bytes=1 << 30,
        row_bytes=100.0,
        batch_size=100,
        level=rng.choice([1, 4]),
    )
    now, waited, rows = 0.0, 0.0, 0
    tuner.observe(now, waited, rows, 0, 0)
    decisions = []
    best, bands = 8, [(0.0, 0.002), (0.002, 0.01), (0.01, 0.05), (0.05, 0.9)]
    for period in range(periods):
        if period % 300 == 0:
            best = rng.choice([1, 2, 4, 8, 16, 64])
        if period % 500 == 499:
            bounds = tuner.restart()
            decisions.append([period, bounds.readahead, bounds.max_in_flight])
            tuner.observe(now, waited, rows, 0, 0)
        level = tuner.bounds().max_in_flight
        low, high = bands[rng.randrange(4) if level < best else rng.choice([0, 0, 1, 2])]
        now += 1.0
        waited += rng.uniform(low, high)
        rows += int(1000 * min(level, best) * rng.uniform(0.8, 1.2))
        bounds = tuner.observe(now, waited, rows, rows * 100, rows)
        if bounds is not None:
            decisions.append([period, bounds.readahead, bounds.max_in_flight])
            now += 0.5
            waited += 0.25
            tuner.observe(now, waited, rows, rows * 100, rows)
    return decisions


def record(tuner_class) -> dict:
    trace = {
        name: simulate(tuner_class, name, options, model) for name, options, model in SCENARIOS
    }
    trace.update({f"fuzz-{seed}": fuzz(tuner_class, seed) for seed in range(4)})
    return trace


if __name__ == "__main__":
    sys.path.insert(0, str(TRACE.parent.parent.parent))
    from lance_prefetch.tuning import DepthTuner

    TRACE.write_text(json.dumps(record(DepthTuner), indent=None) + "\n")
    print({n: len(d) for n, d in json.loads(TRACE.read_text()).items()})  # noqa: T201
