"""Epoch permutations: the order of the row offsets ``0 .. N-1`` in one epoch, two ways to hold it.

Pure code: no Lance, no torch, no global random state. Both kinds are determined by
``(num_rows, seed, epoch)`` only and answer the same question, vectorised: which row offset is at
each position of the epoch (:meth:`Permutation.take`).

``"array"`` (:class:`ArrayPermutation`)
    numpy's ``Generator(PCG64(S)).shuffle`` of ``0 .. N-1`` (:func:`epoch_permutation`), where
    ``S`` is the epoch's ``SeedSequence`` (:mod:`lance_prefetch.plan.sampling`, "Seeds"); materialised
    on first use: ``N * itemsize`` bytes (4 bytes a row below 2**32 rows), its shuffle all spent
    before the first batch.
``"lazy"`` (:class:`LazyPermutation`)
    A keyed bijection computed on demand, constant memory. A position is encrypted by a Feistel
    network over ``b`` bits, the smallest ``b >= 1`` with ``N <= 2**b``: a high half ``A`` of
    ``b // 2`` bits and a low half ``B`` of ``b - b // 2`` bits (one bit apart when ``b`` is odd,
    so the domain is below ``2N``). Round ``i`` replaces ``(A, B)`` by ``(B, A ^ F(B ^ k_i))``, so
    the widths swap each round; ``F`` is splitmix64's finaliser (xor-shifts and two 64-bit
    multiplications) truncated to ``A``'s width, and the round keys ``k_i`` are
    ``S.generate_state(rounds, uint64)``. 8 rounds; 24 for ``b <= 7`` (at most 128 rows), where
    fewer are measurably non-uniform. A value that lands at ``>= N`` is encrypted again (cycle
    walking) until it falls in ``[0, N)``: still a bijection on ``[0, N)``, with fewer than 2
    encryptions a value on average (its cost per row is in ``docs/benchmarks.md``).

``"auto"`` picks ``"lazy"`` above :data:`LAZY_THRESHOLD` rows, else ``"array"``: no process holds
more than 512 MiB of permutation.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from lance_prefetch._validate import check_int, check_seed
from lance_prefetch.plan._seeds import EPOCH_STREAM, seed_sequence

__all__ = [
    "ArrayPermutation",
    "CHUNK_ROWS",
    "IdentityPermutation",
    "KINDS",
    "LAZY_THRESHOLD",
    "LazyPermutation",
    "Permutation",
    "epoch_permutation",
    "index_dtype",
    "make_permutation",
    "resolve_kind",
]

#: The values of the ``permutation`` option.
KINDS = ("auto", "array", "lazy")
#: ``"auto"`` is ``"lazy"`` for more rows than this: 2**27 rows, 512 MiB as ``uint32``.
LAZY_THRESHOLD = 2**27
#: Rows a lazy permutation computes per vectorised pass (bounds its temporary arrays to under 1 MiB).
CHUNK_ROWS = 16384

_ROUNDS = 8
_SMALL_DOMAIN_BITS, _SMALL_DOMAIN_ROUNDS = 7, 24
_TABLE_BITS = 14  # domains up to 2**14 values are computed whole, once: at most 32 KiB kept
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S1, _S2, _S3 = np.uint64(30), np.uint64(27), np.uint64(31)


def index_dtype(num_rows: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds every offset ``0 .. num_rows-1``.

    ``uint8`` up to 256 rows, ``uint16`` up to 65,536, ``uint32`` up to 2**32, else ``uint64``.
    """
    return np.min_scalar_type(max(num_rows - 1, 0))


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """A uniform random permutation of ``0 .. num_rows-1``, determined by ``(seed, epoch)`` only.

    Args:
        num_rows (int): number of rows to permute, ``>= 0``.
        seed (int): base seed, in ``[0, 2**64)``; identical across all ranks and processes of a
            job.
        epoch (int): epoch number, in ``[0, 2**64)``.

    Returns:
        numpy.ndarray: shape ``(num_rows,)``, dtype :func:`index_dtype` ``(num_rows)``, each offset
        exactly once. Costs ``num_rows * itemsize`` bytes (4 bytes a row below 2**32 rows).

    Raises:
        TypeError, ValueError: an argument is not a non-negative integer, or ``seed`` or
            ``epoch`` is ``2**64`` or more.
    """
    num_rows = check_int("num_rows", num_rows, minimum=0)
    rng = np.random.Generator(np.random.PCG64(seed_sequence(seed, EPOCH_STREAM, epoch)))
    permutation = np.arange(num_rows, dtype=index_dtype(num_rows))
    rng.shuffle(permutation)
    return permutation


def resolve_kind(kind: str, num_rows: int) -> str:
    """``kind`` (one of :data:`KINDS`) for ``num_rows`` rows: ``"array"`` or ``"lazy"``.

    Raises:
        TypeError: ``kind`` is not a string.
        ValueError: ``kind`` is not one of :data:`KINDS`.
    """
    if not isinstance(kind, str):
        raise TypeError(f"permutation should be a string, but got permutation={kind!r}")
    if kind not in KINDS:
        raise ValueError(
            f"permutation should be one of {', '.join(map(repr, KINDS))}, but got "
            f"permutation={kind!r}"
        )
    if kind == "auto":
        return "lazy" if num_rows > LAZY_THRESHOLD else "array"
    return kind


def make_permutation(kind: str, num_rows: int, seed: int, epoch: int) -> Permutation:
    """The permutation of epoch ``epoch``: ``kind`` resolved by :func:`resolve_kind`, or
    ``"identity"`` (the dataset's order, for ``shuffle=False``)."""
    if kind == "identity":
        return IdentityPermutation(num_rows, seed, epoch)
    if resolve_kind(kind, num_rows) == "lazy":
        return LazyPermutation(num_rows, seed, epoch)
    return ArrayPermutation(num_rows, seed, epoch)


class Permutation:
    """One epoch's order: position ``p`` in ``[0, num_rows)`` holds row offset ``self[p]``.

    Indexing takes an integer, a slice or an integer array of positions; ``numpy.asarray(self)``
    is the whole permutation (``num_rows * itemsize`` bytes, also for the lazy kind).

    Args:
        num_rows (int): rows permuted, ``>= 1``.
        seed (int): base seed, in ``[0, 2**64)``.
        epoch (int): epoch number, ``>= 0``.

    Attributes:
        kind (str): ``"array"``, ``"lazy"`` or ``"identity"``.
        dtype (numpy.dtype): :func:`index_dtype` ``(num_rows)``, the dtype of every result.
    """

    kind = ""

    def __init__(self, num_rows: int, seed: int, epoch: int) -> None:
        self.num_rows = check_int("num_rows", num_rows, minimum=1)
        self.seed = check_seed("seed", seed)
        self.epoch = check_int("epoch", epoch, minimum=0)
        self.dtype = index_dtype(num_rows)

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The row offsets at ``positions`` (integers in ``[0, num_rows)``), same shape.

        Raises:
            TypeError: ``positions`` are not integers.
            IndexError: a position is outside ``[0, num_rows)``.
        """
        positions = np.asarray(positions)
        if positions.dtype.kind not in "iu":
            raise TypeError(f"positions should be integers, but got dtype {positions.dtype}")
        if positions.size and (positions.min() < 0 or positions.max() >= self.num_rows):
            raise IndexError(
                f"positions should be in [0, {self.num_rows}), but got "
                f"[{positions.min()}, {positions.max()}]"
            )
        return self._take(positions)

    def slice(self, start: int, stop: int) -> np.ndarray:
        """The row offsets at positions ``start .. stop-1`` (``0 <= start <= stop <= num_rows``)."""
        return self._take(np.arange(start, stop))

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.num_rows)
            if step == 1:
                return self.slice(start, max(start, stop))
            return self._take(np.arange(start, stop, step))
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            position = int(key) + (self.num_rows if key < 0 else 0)
            return int(self.take(np.array([position]))[0])
        return self.take(key)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self[:], dtype=dtype)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_rows={self.num_rows}, seed={self.seed}, epoch={self.epoch})"
        )

    def _take(self, positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class ArrayPermutation(Permutation):
    """The materialised kind: :func:`epoch_permutation`, computed on first use and kept."""

    kind = "array"

    @functools.cached_property
    def array(self) -> np.ndarray:
        """The whole permutation, :func:`epoch_permutation` ``(num_rows, seed, epoch)``."""
        return epoch_permutation(self.num_rows, self.seed, self.epoch)

    def slice(self, start: int, stop: int) -> np.ndarray:
        """A view of :attr:`array`."""
        return self.array[start:stop]

    def _take(self, positions: np.ndarray) -> np.ndarray:
        taken: np.ndarray = self.array[positions]  # (numpy types fancy indexing as Any)
        return taken


class IdentityPermutation(Permutation):
    """The dataset's own order (``shuffle=False``): position ``p`` holds row offset ``p``, for
    every seed and epoch. Constant memory."""

    kind = "identity"

    def slice(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start, stop, dtype=self.dtype)

    def _take(self, positions: np.ndarray) -> np.ndarray:
        return positions.astype(self.dtype)


class LazyPermutation(Permutation):
    """The constant-memory kind: a keyed Feistel bijection with cycle walking (module docstring).

    It holds a few integers and its round keys; each result is computed from the positions asked
    for, in passes of at most :data:`CHUNK_ROWS` values. (Up to 16,384 rows, the whole order is
    computed on first use and kept, at most 32 KiB: the same values, faster.)
    """

    kind = "lazy"

    def __init__(self, num_rows: int, seed: int, epoch: int) -> None:
        super().__init__(num_rows, seed, epoch)
        bits = max((num_rows - 1).bit_length(), 1)
        rounds = _SMALL_DOMAIN_ROUNDS if bits <= _SMALL_DOMAIN_BITS else _ROUNDS
        self._bits = bits
        self._high, self._low = bits // 2, bits - bits // 2  # widths of A and B; even rounds
        self._keys = seed_sequence(seed, EPOCH_STREAM, epoch).generate_state(rounds, np.uint64)

    def slice(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, dtype=self.dtype)
        for first in range(start, stop, CHUNK_ROWS):
            last = min(first + CHUNK_ROWS, stop)
            out[first - start : last - start] = self._pass(np.arange(first, last))
        return out

    def _take(self, positions: np.ndarray) -> np.ndarray:
        flat = positions.reshape(-1)
        if flat.size <= CHUNK_ROWS:
            return self._pass(flat).reshape(positions.shape)
        out = np.empty(flat.size, dtype=self.dtype)
        for first in range(0, flat.size, CHUNK_ROWS):
            out[first : first + CHUNK_ROWS] = self._pass(flat[first : first + CHUNK_ROWS])
        return out.reshape(positions.shape)

    @functools.cached_property
    def _table(self) -> np.ndarray:
        """A small domain's whole order: the domain encrypted once, cycle walking by lookups."""
        step = self._encrypt(np.arange(1 << self._bits, dtype=np.uint64))
        values = step[: self.num_rows].copy()
        walking = np.flatnonzero(values >= self.num_rows)
        while walking.size:
            values[walking] = step[values[walking]]
            walking = walking[values[walking] >= self.num_rows]
        return values.astype(self.dtype)

    def _pass(self, positions: np.ndarray) -> np.ndarray:
        """The offsets at ``positions`` (1-D), in one vectorised pass."""
        if self._bits <= _TABLE_BITS:
            looked_up: np.ndarray = self._table[positions]  # (numpy: fancy indexing is Any)
            return looked_up
        values = self._encrypt(positions.astype(np.uint64))
        walking = np.flatnonzero(values >= self.num_rows)
        while walking.size:  # cycle walking: the orbit of a position in [0, N) returns to it
            values[walking] = self._encrypt(values[walking])
            walking = walking[values[walking] >= self.num_rows]
        return values.astype(self.dtype, copy=False)

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        """The Feistel network on ``uint64`` values below ``2**bits``; overwrites ``values``."""
        high, low = self._high, self._low
        a = values >> np.uint64(low)
        b = values
        b &= np.uint64((1 << low) - 1)
        f, t = np.empty_like(a), np.empty_like(a)
        for key in self._keys:  # (a, b) -> (b, a ^ F(b ^ key)); the widths swap
            np.bitwise_xor(b, key, out=f)
            np.right_shift(f, _S1, out=t)
            f ^= t
            f *= _M1
            np.right_shift(f, _S2, out=t)
            f ^= t
            f *= _M2
            np.right_shift(f, _S3, out=t)
            f ^= t
            f &= np.uint64((1 << high) - 1)
            f ^= a
            a, b, f = b, f, a
            high, low = low, high
        a <<= np.uint64(low)
        a |= b
        return a
