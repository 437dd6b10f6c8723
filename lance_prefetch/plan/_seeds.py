"""Every random stream's seed, derived in one place: :func:`seed_sequence` (the rule is in
:mod:`lance_prefetch.plan.sampling`'s docstring, "Seeds").

Pure code: numpy only. A stream is named by a 32-bit word and takes a base ``seed`` in
``[0, 2**64)`` and a fixed number of values in ``[0, 2**64)`` (:data:`STREAMS`); its
``numpy.random.SeedSequence`` has as entropy the ``uint32`` words of all three at a fixed width,
so no two inputs share an entropy.
"""

from __future__ import annotations

import numpy as np

from lance_prefetch._validate import check_seed

__all__ = ["EPOCH_STREAM", "MIXTURE_STREAM", "SPLIT_STREAM", "STREAMS", "seed_sequence"]

#: An epoch's permutation: one value, the epoch.
EPOCH_STREAM = 0x45504F43  # "EPOC"
#: A mixture's dataset: one value, the dataset's index in ``source``.
MIXTURE_STREAM = 0x4D495854  # "MIXT"
#: A split's permutation (``by="position"``): no value.
SPLIT_STREAM = 0x53504C54  # "SPLT"
#: Each stream's name and its number of values.
STREAMS = {EPOCH_STREAM: ("epoch",), MIXTURE_STREAM: ("index",), SPLIT_STREAM: ()}

_SEED_WORDS = 4  # a spawn key's padding: the split stream is SeedSequence(seed, spawn_key=(...))


def seed_sequence(seed: int, stream: int, *values: int) -> np.random.SeedSequence:
    """The ``SeedSequence`` of stream ``stream`` for ``seed`` and ``values``.

    Its entropy is the ``uint32`` words ``[s_0, s_1, s_2, s_3, stream, v_lo, v_hi, ...]``:
    ``seed`` as 4 words and each value as 2, low word first, zero words kept. Every stream has
    a fixed number of values, so the words' count fixes the stream's layout and distinct
    ``(stream, seed, values)`` have distinct entropies (numpy mixes every word of an entropy of
    more than 4 words, so the sequences differ too, but for a 128-bit hash collision). With no
    values, the words are those of ``SeedSequence(seed, spawn_key=(stream,))``, which pads the
    seed to 4 words before its spawn key.

    Raises:
        TypeError: ``seed`` or a value is not an integer.
        ValueError: ``stream`` is not one of :data:`STREAMS` or gets another number of values;
            ``seed`` or a value is outside ``[0, 2**64)``.
    """
    names = STREAMS.get(stream)
    if names is None or len(names) != len(values):
        raise ValueError(f"stream {stream:#x} with {len(values)} values is not one of STREAMS")
    words = [*_words(check_seed("seed", seed), _SEED_WORDS), stream]
    for name, value in zip(names, values, strict=True):
        words += _words(check_seed(name, value), 2)
    return np.random.SeedSequence(np.array(words, dtype=np.uint32))


def _words(value: int, count: int) -> list[int]:
    """``value`` as ``count`` 32-bit words, low first (``value < 2**(32 * count)``)."""
    return [(value >> (32 * i)) & 0xFFFFFFFF for i in range(count)]
