"""A weighted mixture's arithmetic, pure (no Lance, no I/O): how many rows each dataset gives
an epoch, and which of its rows they are.

With weights ``w_i`` (normalised to sum to 1) over datasets of ``N_i`` rows, an epoch holds

    ``L = min_i floor(N_i / w_i)``

rows (:func:`epoch_length`): the longest epoch in which no dataset runs out, so the dataset that
binds is read whole and the others in part. Dataset ``i`` gives ``n_i`` of them
(:func:`mixture_counts`): ``L * w_i`` rounded by the largest remainder rule (ties to the lower
index), so the counts sum to ``L`` and each is within one row of ``L * w_i`` and at most
``N_i``. Position ``p`` of the epoch's ``L`` belongs to dataset ``i`` when
``start_i <= p < start_i + n_i`` (the blocks in the order of ``source``); the loader's uniform
permutation of the ``L`` positions then interleaves the datasets, exactly ``n_i`` rows of each
per epoch. Within dataset ``i``, epoch ``e`` reads the first ``n_i`` rows of a permutation of its
``N_i`` rows seeded by ``(seed, i)`` and ``e`` (:func:`dataset_seed`): no row twice in an epoch,
another sample each epoch, so rows repeat across epochs only. Without shuffling
(``shuffle=False``) both orders are the identity: an epoch reads the first ``n_i`` rows of each
dataset, dataset after dataset, the same every epoch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lance_prefetch.plan._seeds import MIXTURE_STREAM, seed_sequence

__all__ = ["dataset_seed", "epoch_length", "mixture_counts"]


def epoch_length(weights: Sequence[float], sizes: Sequence[int]) -> int:
    """``L = min_i floor(N_i / w_i)`` rows. Weights like ``7 / 12`` are not exact in floats:
    ``147 / (7 / 12)`` is ``251.99...`` and ``252 * (7 / 12)`` is ``147.00...03``, so the
    quotient is nudged up by a relative ``1e-12`` and ``L`` lowered only while an epoch's
    counts (:func:`mixture_counts`) would exceed a dataset's rows. A weight so small (or
    ``0.0``) that ``N_i / w_i`` overflows to infinity bounds nothing (the largest weight,
    ``>= 1 / n``, always bounds)."""
    quotients = [
        size / weight * (1 + 1e-12) if weight else math.inf
        for weight, size in zip(weights, sizes, strict=True)
    ]
    length = math.floor(min(quotients))
    while (mixture_counts(weights, length) > np.asarray(sizes)).any():
        length -= 1  # float rounding of size / weight; never more than a step or two
    return length


def mixture_counts(weights: Sequence[float], length: int) -> np.ndarray:
    """The rows of each dataset in an epoch of ``length`` rows: the largest remainder rounding
    of ``length * w_i`` (ties to the lower index), summing to ``length`` (``int64``)."""
    shares = np.array([length * w for w in weights], dtype=np.float64)
    counts = np.floor(shares).astype(np.int64)
    short = length - int(counts.sum())
    # remainders to 1e-6: 371 * (3 / 14) is 79.49999... and 371 * (9 / 14) 238.50000...3, a tie
    # float noise would break; the rule breaks it to the lower index
    order = np.argsort(-np.round(shares - counts, 6), kind="stable")
    counts[order[:short]] += 1
    return counts


def dataset_seed(seed: int, index: int) -> int:
    """The seed of dataset ``index``'s permutations (``< 2**64``): the first ``uint64`` of the
    mixture stream's ``SeedSequence`` for ``(seed, index)`` (:mod:`lance_prefetch.plan.sampling`,
    "Seeds"), so datasets shuffle independently of each other and of the epoch's order."""
    state = seed_sequence(seed, MIXTURE_STREAM, index).generate_state(1, np.uint64)
    return int(state[0])
