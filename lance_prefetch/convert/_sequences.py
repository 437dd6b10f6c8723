"""The arithmetic of token sequences, for :mod:`lance_prefetch.convert.tokens` (its public face).

A batch's variable-length rows become one :class:`Flat`: every row's tokens in order in one 1-D
tensor, and the rows' lengths. From it, :func:`pad` makes ``(rows, width)`` padded rows and their
mask, and :func:`pack` makes ``(rows, seq_len)`` packed rows and their document boundaries. Every
step is a few whole-array torch/numpy operations: no Python loop runs per token (only
:func:`flatten` reads each row's length and address once, as a list of tensors offers nothing
better). Pure: no I/O, no threads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lance_prefetch.convert._arrow import to_tensors
from lance_prefetch.convert._projection import _whole

__all__ = ["Flat", "IGNORE_INDEX", "check_pad_value", "flatten", "pack", "pad", "truncate"]

#: The label of a token no loss is computed for (``torch.nn.CrossEntropyLoss``'s default
#: ``ignore_index``, and what Hugging Face collators write).
IGNORE_INDEX = -100


@dataclasses.dataclass(frozen=True)
class Flat:
    """A batch of sequences as one tensor: row ``i`` is ``values[starts[i]:starts[i] + lengths[i]]``.

    Attributes:
        values (torch.Tensor): 1-D, ``lengths.sum()`` elements.
        lengths (numpy.ndarray): int64, one per row.
    """

    values: torch.Tensor
    lengths: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        """Where each row begins in :attr:`values` (int64)."""
        return np.cumsum(self.lengths) - self.lengths

    @property
    def total(self) -> int:
        """The number of tokens in the batch."""
        return int(self.values.shape[0])


def flatten(sequences: Any, column: str) -> Flat:
    """``sequences`` as a :class:`Flat`, zero-copy where possible.

    Accepts what :func:`~lance_prefetch.convert.to_tensors` makes of a variable-length list column
    (a list of 1-D tensors, views of one buffer: zero-copy), any sequence of 1-D tensors, numpy
    arrays or lists of numbers (copied into one tensor; an empty Python list counts as int64), a
    2-D tensor (a fixed-size list column: every row full) or a pyarrow (chunked) list array
    (zero-copy from its offsets and values).

    Raises:
        TypeError: another kind of value, or rows that are not 1-D.
        ValueError: a null row (``None``); the message names ``column`` and the row.
    """
    if isinstance(sequences, pa.ChunkedArray):
        sequences = _whole(sequences)  # one chunk (a Lance take): no copy
    if isinstance(sequences, pa.Array):
        return _from_arrow(sequences, column)
    if isinstance(sequences, torch.Tensor):
        if sequences.ndim != 2:
            raise TypeError(
                f"column {column!r} is a tensor of shape {tuple(sequences.shape)}; a batch of "
                f"sequences is a list of 1-D tensors or a (rows, length) tensor"
            )
        num_rows, width = sequences.shape
        return Flat(sequences.reshape(-1), np.full(num_rows, width, dtype=np.int64))
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence):
        raise TypeError(
            f"column {column!r} is a {type(sequences).__name__}; a batch of sequences is a list "
            f"of 1-D tensors (a list<int> column as the loader converts it), a (rows, length) "
            f"tensor or a pyarrow list array"
        )
    rows = [_row(row, column, i) for i, row in enumerate(sequences)]
    lengths = np.fromiter((row.shape[0] for row in rows), dtype=np.int64, count=len(rows))
    return Flat(_joined(rows, lengths), lengths)


def _row(row: Any, column: str, index: int) -> torch.Tensor:
    if row is None:
        raise ValueError(
            f"column {column!r}: row {index} of the batch is null (None), which has no tokens to "
            f"pad or pack; fill it in the dataset (an empty list is a sequence of no tokens)"
        )
    if not isinstance(row, torch.Tensor):
        empty_list = isinstance(row, (list, tuple)) and not row
        row = torch.zeros(0, dtype=torch.int64) if empty_list else torch.as_tensor(row)
    if row.ndim != 1:
        raise TypeError(
            f"column {column!r}: row {index} of the batch has shape {tuple(row.shape)}; each row "
            f"should be a 1-D sequence of token ids"
        )
    return row


def _joined(rows: list[torch.Tensor], lengths: np.ndarray) -> torch.Tensor:
    """The rows one after the other: a view of their buffer when they lie in it back to back (as
    :mod:`~lance_prefetch.convert` slices them from the Arrow values), else a copy."""
    if not rows:
        return torch.zeros(0, dtype=torch.int64)
    present = [row for row in rows if row.shape[0]]  # an empty row adds no values (its address
    if not present:  # is 0), nor a dtype
        return rows[0].new_zeros(0)
    first = present[0]
    if all(
        row.dtype == first.dtype and row.device == first.device and row.is_contiguous()
        for row in present
    ):
        addresses = np.fromiter((row.data_ptr() for row in present), np.int64, len(present))
        if np.array_equal(np.diff(addresses), lengths[lengths > 0][:-1] * first.element_size()):
            try:  # a view of the first row's storage, if the others lie in it
                return torch.as_strided(first, (int(lengths.sum()),), (1,), first.storage_offset())
            except RuntimeError:  # they lie past its storage's end: another buffer
                pass
    return torch.cat(present) if len(present) > 1 else present[0]


def _from_arrow(array: pa.Array, column: str) -> Flat:
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise TypeError(
            f"column {column!r} has Arrow type {array.type}; sequences are a list<T> or "
            f"large_list<T> array of numbers"
        )
    if array.null_count:
        first = int(np.flatnonzero(~array.is_valid().to_numpy(zero_copy_only=False))[0])
        _row(None, column, first)  # raises, naming the row
    offsets = array.offsets.to_numpy().astype(np.int64)  # of array.values (ignores a slice)
    start, end = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    values = to_tensors(pa.table({column: array.values.slice(start, end - start)}))[column]
    if not isinstance(values, torch.Tensor) or values.ndim != 1:
        raise TypeError(
            f"column {column!r} has Arrow type {array.type}; each row should be a list of numbers"
        )
    return Flat(values, np.diff(offsets))


def check_pad_value(value: float, dtype: torch.dtype, name: str, column: str) -> None:
    """``value`` (the parameter ``name``) must be exactly representable in ``dtype``, the column's
    (torch would wrap ``-100`` into a uint8 and cut ``0.5`` to ``0`` without a word).

    Raises:
        ValueError: it is not; the message names the parameter, the column and its dtype.
    """
    if dtype.is_floating_point or dtype.is_complex:
        return
    if dtype == torch.bool:
        fits = value in (0, 1)
    else:
        info = torch.iinfo(dtype)
        fits = float(value).is_integer() and info.min <= value <= info.max
    if not fits:
        raise ValueError(
            f"{name}={value!r} does not fit column {column!r}, whose tokens are {dtype}; pass a "
            f"{name} that {dtype} holds exactly"
        )


def truncate(flat: Flat, max_length: int, side: str) -> Flat:
    """Every row cut to at most ``max_length`` tokens: its first ones (``side="right"`` cuts the
    end) or its last ones (``"left"``)."""
    lengths = flat.lengths
    if not (lengths > max_length).any():
        return flat
    within = np.arange(flat.total) - np.repeat(flat.starts, lengths)  # position in its row
    if side == "right":
        keep = within < max_length
    else:
        keep = within >= np.repeat(lengths - max_length, lengths)
    kept = torch.from_numpy(keep).to(flat.values.device)
    return Flat(flat.values[kept], np.minimum(lengths, max_length))


def pad(flat: Flat, width: int, pad_value: float, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(padded, mask)``: the rows as a ``(rows, width)`` tensor of their dtype, ``pad_value``
    after them (``side="right"``) or before them (``"left"``), and the bool mask of the tokens.
    Every row must fit (``lengths <= width``). Rows all ``width`` long: ``padded`` is a view of
    ``flat.values``, no copy."""
    rows, values = len(flat.lengths), flat.values
    if rows and (flat.lengths == width).all():
        mask = torch.ones((rows, width), dtype=torch.bool, device=values.device)
        return values.view(rows, width), mask
    positions = torch.arange(width, device=values.device)
    lengths = torch.from_numpy(flat.lengths).to(values.device)[:, None]
    mask = positions < lengths if side == "right" else positions >= width - lengths
    padded = torch.full((rows, width), pad_value, dtype=values.dtype, device=values.device)
    # masked_scatter_ fills the mask's True places in row-major order: exactly the rows' order
    return padded.masked_scatter_(mask, values), mask


def pack(
    flat: Flat, seq_len: int, pad_value: float, *, labels: bool, boundaries: bool
) -> dict[str, Any]:
    """The tokens of every row, in order, cut into ``ceil(total / seq_len)`` rows of ``seq_len``
    (the last one padded at its end), with Hugging Face's names: ``input_ids`` (the column's
    dtype; a view of ``flat.values`` when nothing is padded), ``attention_mask`` (int64), with
    ``labels`` ``labels`` (int64), with ``boundaries`` ``position_ids`` (int64), ``seq_idx``
    (int32), ``cu_seq_lens`` (int32) and ``max_length`` (an int); see
    :class:`~lance_prefetch.convert.tokens.PackTokens`."""
    values, lengths, total = flat.values, flat.lengths, flat.total
    device = values.device
    rows = -(-total // seq_len)
    size, padding = rows * seq_len, rows * seq_len - total
    if padding:
        ids = torch.full((size,), pad_value, dtype=values.dtype, device=device)
        ids[:total] = values
    else:
        ids = values  # no copy
    mask = torch.zeros(size, dtype=torch.int64, device=device)
    mask[:total] = 1
    out: dict[str, torch.Tensor | int] = {
        "input_ids": ids.view(rows, seq_len),
        "attention_mask": mask.view(rows, seq_len),
    }
    starts = flat.starts[lengths > 0]  # each non-empty document's first token
    if labels:
        label = ids.to(torch.int64, copy=True)
        label[total:] = IGNORE_INDEX
        label[torch.from_numpy(starts).to(device)] = IGNORE_INDEX  # no prediction across
        out["labels"] = label.view(rows, seq_len)
    if boundaries:
        # the padding counts as one more sequence (positions from 0, seq_idx = number of
        # documents), as boundaries derived from position_ids make it: the two agree
        position = np.empty(size, dtype=np.int64)
        np.subtract(np.arange(total), np.repeat(flat.starts, lengths), out=position[:total])
        position[total:] = np.arange(padding)
        seq_idx = np.empty(size, dtype=np.int32)
        seq_idx[:total] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        seq_idx[total:] = len(lengths)
        cu_seq_lens = np.concatenate([starts, [total], [size] if padding else []]).astype(np.int32)
        out["position_ids"] = torch.from_numpy(position).to(device).view(rows, seq_len)
        out["seq_idx"] = torch.from_numpy(seq_idx).to(device).view(rows, seq_len)
        out["cu_seq_lens"] = torch.from_numpy(cu_seq_lens).to(device)
        out["max_length"] = int(np.diff(cu_seq_lens).max()) if total else 0
    return out
