"""Splits: a deterministic, seeded division of a dataset's rows (or of a filter's matching rows)
into named, disjoint parts by fraction, such as ``{"train": 0.9, "validation": 0.1}``.

Pure code: numpy and pyarrow arrays only, no Lance, no I/O, no global random state. A
:class:`Split` names the parts and the one a loader reads
(``PrefetchLoader(..., split=Split(fractions={"train": 0.9, "validation": 0.1}, name="train"))``);
the loader applies it once, at construction, and every rank and DataLoader worker reads that
part: nothing is copied, the part is a list of row offsets (``docs/subsets.md``).

The parts are laid out in the order of their names, sorted, whatever the order of the mapping:
``{"train": 0.9, "validation": 0.1}`` and ``{"validation": 0.1, "train": 0.9}`` are one split,
so a training and an evaluation script that write the fractions differently still get disjoint
parts.

Two ways to assign rows to parts
--------------------------------
``by="position"`` (the default): **exact sizes; they change when rows change.**
    The ``m`` rows (the matching rows, in dataset order) are shuffled once by a permutation of
    their positions that only the split's ``seed`` decides (:func:`split_order`: numpy's
    ``Generator(PCG64(SeedSequence(seed, spawn_key=(SPLIT_STREAM,))))``, a stream apart from
    every epoch's (:mod:`lance_prefetch.plan.sampling`, "Seeds"), so the loader's ``seed`` never moves
    a row to another part). The parts take consecutive runs of it, of :func:`split_sizes` rows each.
    Appending, deleting or filtering rows changes ``m`` and reshuffles every part.
``by="<column>"``: **stable under appends; sizes approximate.**
    Each row's part depends only on its value in that column (integer, string or binary; or a
    struct's field of those types, by its dotted path: ``by="meta.doc"``) and the seed
    (:func:`key_hashes`): a row keeps its part when rows are appended or deleted, and rows with
    equal keys share a part (no document straddles train and validation). A part's size is
    binomial around ``fraction * m`` (within a few ``sqrt(m * fraction)`` rows).

Sizes with ``by="position"``: the largest remainder rule
--------------------------------------------------------
Part ``i`` first gets ``floor(f_i * m)`` rows; the ``m - sum`` rows left go one each to the
parts with the largest remainders ``f_i * m - floor(f_i * m)``, ties to the earlier name. The
sizes sum to ``m`` and each is within one row of ``f_i * m``. ``torch.utils.data.random_split``
hands its remainder round-robin instead; the largest remainder keeps each part nearest its
fraction.

The hash (``by=<column>``), exactly
-----------------------------------
With wrapping 64-bit arithmetic and ``fmix`` splitmix64's finaliser
(``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``):
an integer key ``v`` is ``x = v`` (two's complement); a string or binary key of bytes
``b_0 .. b_{L-1}`` is ``x = sum((b_j + 1) * P**(L-1-j))`` with ``P = 0x100000001B3``; the row's
hash is ``h = fmix(fmix(x) ^ fmix(seed + 0x9E3779B97F4A7C15))``, and its part is the ``i`` with
``T_i <= h < T_{i+1}``, ``T_i = floor(2**64 * (f_0 + ... + f_{i-1}))`` over the sorted names.
Written out here so that any version (or another language) assigns the same parts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa

from lance_prefetch._validate import check_int, check_seed
from lance_prefetch.plan._seeds import SPLIT_STREAM, seed_sequence
from lance_prefetch.plan.permutation import _M1, _M2, index_dtype

__all__ = [
    "BY_POSITION",
    "SPLIT_STREAM",
    "Split",
    "key_hashes",
    "key_parts",
    "part_positions",
    "split_order",
    "split_sizes",
]

#: The ``by`` of a split by position in a seeded permutation (exact sizes).
BY_POSITION = "position"

_P = np.uint64(0x100000001B3)
_GOLDEN = 0x9E3779B97F4A7C15
_TOLERANCE = 1e-9
_EXAMPLE = "Split(fractions={'train': 0.9, 'validation': 0.1}, name='train')"


@dataclass(frozen=True, kw_only=True)
class Split:
    """One named part of a seeded split of the rows (of the filter's matching rows, with
    ``filter=``) into disjoint parts by fraction.

    Args:
        fractions (Mapping[str, float]): each part's name and fraction of the rows, each in
            ``(0, 1]``, summing to 1 (within 1e-9); stored sorted by name (the order parts are
            laid out in). To leave rows out, name a part for them and do not read it.
        name (str): the part to read, one of ``fractions``.
        seed (int, optional): the split's own seed, in ``[0, 2**64)``, independent of the
            loader's ``seed`` (which shuffles epochs): the same on every rank, in every script
            that reads a part. Default: ``0``.
        by (str, optional): ``"position"``: exact sizes (:func:`split_sizes`), by position in a
            seeded permutation of the rows, changed by any change to the rows; or the name of an
            integer, string or binary column, or a dotted path to such a field of a struct
            column (``"meta.doc"``, as ``columns`` takes): each row's part from a hash of its
            value (stable under appends, equal keys in one part, sizes approximate). Default: ``"position"``
            (so a column named ``position`` cannot be the key: rename it, e.g. with
            ``add_columns``).

    Raises:
        TypeError: a field has the wrong type.
        ValueError: no parts, a fraction outside ``(0, 1]``, fractions that do not sum to 1, a
            ``name`` that is not a part, a ``seed`` outside ``[0, 2**64)``, an empty ``by`` (each
            message names the field and the fix).
    """

    fractions: Mapping[str, float]
    name: str
    seed: int = 0
    by: str = BY_POSITION

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", _check_fractions(self.fractions))
        if not isinstance(self.name, str):
            raise TypeError(f"Split name should be a str, but got name={self.name!r}")
        if self.name not in self.fractions:
            raise ValueError(
                f"Split name={self.name!r} is not one of the parts {list(self.fractions)}; pass "
                f"one of them (every part is read by its own loader)"
            )
        object.__setattr__(self, "seed", check_seed("Split seed", self.seed))
        if not isinstance(self.by, str):
            raise TypeError(
                f"Split by should be 'position' or a column name (str), but got by={self.by!r}"
            )
        if not self.by:
            raise ValueError("Split by should be 'position' or a column name, but got by=''")

    @property
    def fraction(self) -> float:
        """The fraction of the part read, ``fractions[name]``."""
        return self.fractions[self.name]

    def to_state(self) -> dict[str, Any]:
        """The split as a checkpoint records it: JSON-able, equal after a JSON round trip."""
        parts = [[part, fraction] for part, fraction in self.fractions.items()]
        return {"fractions": parts, "name": self.name, "seed": self.seed, "by": self.by}


def split_sizes(num_rows: int, fractions: Mapping[str, float]) -> dict[str, int]:
    """Each part's size for ``num_rows`` rows by the largest remainder rule (module docstring):
    the sizes sum to ``num_rows``, each within one row of ``fraction * num_rows``.

    Args:
        num_rows (int): rows split, ``>= 0``.
        fractions (Mapping[str, float]): as :class:`Split` takes them.

    Returns:
        dict[str, int]: part name to rows, in sorted name order.

    Raises:
        TypeError, ValueError: as :class:`Split` for ``fractions``; ``num_rows < 0``.
    """
    num_rows = check_int("num_rows", num_rows, minimum=0)
    parts = _check_fractions(fractions)
    # exact: a fraction is a binary float, so f * m splits into whole and remainder unrounded
    quotas = {name: Fraction(fraction) * num_rows for name, fraction in parts.items()}
    sizes = {name: math.floor(quota) for name, quota in quotas.items()}
    left = num_rows - sum(sizes.values())
    order = sorted(parts, key=lambda name: -(quotas[name] - sizes[name]))  # stable: names
    for name in order[: max(left, 0)]:
        sizes[name] += 1
    return sizes


def split_order(num_rows: int, seed: int) -> np.ndarray:
    """The split's permutation of positions ``0 .. num_rows-1`` (``by="position"``): numpy's
    ``Generator(PCG64(SeedSequence(seed, spawn_key=(SPLIT_STREAM,)))).shuffle`` of them, dtype
    :func:`~lance_prefetch.plan.permutation.index_dtype` ``(num_rows)`` (4 bytes a row below 2**32)."""
    sequence = seed_sequence(seed, SPLIT_STREAM)
    order = np.arange(num_rows, dtype=index_dtype(num_rows))
    np.random.Generator(np.random.PCG64(sequence)).shuffle(order)
    return order


def part_positions(num_rows: int, split: Split) -> np.ndarray:
    """The positions (in ``0 .. num_rows-1``, ascending) that part ``split.name`` holds, by
    position (``by="position"``): its run of :func:`split_order`, sorted. The parts of one
    split are disjoint and together hold every position once.

    Raises:
        ValueError: ``split.by`` is not ``"position"``.
    """
    if split.by != BY_POSITION:
        raise ValueError(f"part_positions splits by position, but split.by={split.by!r}")
    sizes = split_sizes(num_rows, split.fractions)
    names = list(sizes)
    start = sum(sizes[name] for name in names[: names.index(split.name)])
    part = split_order(num_rows, split.seed)[start : start + sizes[split.name]]
    part.sort()
    return part


def key_hashes(keys: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """Each key's 64-bit hash under ``seed`` (module docstring), for ``by=<column>`` splits.

    Args:
        keys (pyarrow.Array | pyarrow.ChunkedArray): integer, string or binary values (large
            variants too), without nulls.
        seed (int): the split's seed, in ``[0, 2**64)``.

    Returns:
        numpy.ndarray: shape ``(len(keys),)``, ``uint64``.

    Raises:
        TypeError: the keys are of another type.
        ValueError: a key is null.
    """
    seed = check_seed("seed", seed)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if keys.null_count:
        raise ValueError(f"split keys should not be null, but {keys.null_count} are")
    kind = keys.type
    if pa.types.is_integer(kind):
        values = keys.to_numpy(zero_copy_only=False)
        signed = values.dtype.kind == "i"  # two's complement: -1 is 2**64 - 1
        x = values.astype(np.int64).view(np.uint64) if signed else values.astype(np.uint64)
    elif pa.types.is_string(kind) or pa.types.is_binary(kind):
        x = _bytes_hash(keys, np.int32)
    elif pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        x = _bytes_hash(keys, np.int64)
    else:
        raise TypeError(f"split keys should be integers, strings or binaries, but they are {kind}")
    salt = _fmix(np.array([(seed + _GOLDEN) % 2**64], dtype=np.uint64))
    return _fmix(_fmix(x) ^ salt)


def key_parts(hashes: np.ndarray, split: Split) -> np.ndarray:
    """Which rows, by their :func:`key_hashes`, fall in part ``split.name``: a bool mask.

    Part ``i`` (of the names sorted) holds ``T_i <= h < T_{i+1}``,
    ``T_i = floor(2**64 * (f_0 + ... + f_{i-1}))``; the last part ends at ``2**64``."""
    names = list(split.fractions)
    index = names.index(split.name)
    low = _threshold(split, index)
    high = _threshold(split, index + 1) if index + 1 < len(names) else None
    mask = hashes >= np.uint64(low)
    if high is not None:
        mask &= hashes < np.uint64(high)
    return mask


def _threshold(split: Split, index: int) -> int:
    """``T_index``: where part ``index`` starts among the 64-bit hashes (exact in integers)."""
    total = sum(Fraction(f) for f in list(split.fractions.values())[:index])
    return min(math.floor(total * 2**64), 2**64 - 1)


def _bytes_hash(keys: pa.Array, offset_type: type) -> np.ndarray:
    """``sum((b_j + 1) * P**(L-1-j))`` of each value's bytes, wrapping at 2**64, vectorised:
    O(total bytes) with one cumulative sum (an empty value hashes to 0)."""
    buffers = keys.buffers()
    offsets: np.ndarray = np.frombuffer(buffers[1], dtype=offset_type)[
        keys.offset : keys.offset + len(keys) + 1
    ]
    offsets = offsets.astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    first, last = int(offsets[0]), int(offsets[-1])
    data = data[first:last].astype(np.uint64) + np.uint64(1)
    starts, ends = offsets[:-1] - first, offsets[1:] - first
    lengths = ends - starts
    longest = int(lengths.max()) if len(lengths) else 0
    powers = np.full(max(longest, 1), _P, dtype=np.uint64)
    powers[0] = 1
    powers = np.cumprod(powers, dtype=np.uint64)  # P**k, wrapping
    exponents = np.repeat(ends - 1, lengths) - np.arange(len(data), dtype=np.int64)
    terms = data * powers[exponents] if len(data) else data
    sums = np.zeros(len(data) + 1, dtype=np.uint64)
    np.cumsum(terms, dtype=np.uint64, out=sums[1:])
    hashes: np.ndarray = sums[ends] - sums[starts]  # (numpy types fancy indexing as Any)
    return hashes


def _fmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (wrapping ``uint64``)."""
    z = z.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _check_fractions(fractions: Any) -> dict[str, float]:
    """``fractions`` as a dict sorted by name, each in ``(0, 1]``, summing to 1."""
    if not isinstance(fractions, Mapping):
        raise TypeError(
            f"Split fractions should be a mapping of part names to fractions, such as "
            f"{{'train': 0.9, 'validation': 0.1}}, but got fractions={fractions!r}"
        )
    if not fractions:
        raise ValueError(f"Split fractions should name at least one part, e.g. {_EXAMPLE}")
    checked = {}
    for name, fraction in fractions.items():
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"Split fractions: part names should be non-empty str, but got {name!r}"
            )
        if isinstance(fraction, bool) or not isinstance(
            fraction, (int, float, np.floating, np.integer)
        ):
            raise TypeError(
                f"Split fractions[{name!r}] should be a number in (0, 1], but got {fraction!r}"
            )
        fraction = float(fraction)
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise ValueError(f"Split fractions[{name!r}] should be in (0, 1], but got {fraction!r}")
        checked[name] = fraction
    total = math.fsum(checked.values())
    if abs(total - 1) > _TOLERANCE:
        fix = (  # 12 digits: a sum of 1.000000004 is not printed as 1
            f"add a part for the rest (e.g. 'rest': {1 - total:.12g}) if rows should be left out"
            if total < 1
            else "lower the fractions"
        )
        raise ValueError(
            f"Split fractions should sum to 1, but {checked} sum to {total:.12g}; {fix}"
        )
    return dict(sorted(checked.items()))
