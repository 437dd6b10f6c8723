"""Token sequences: pad a variable-length list column, or pack it into fixed-length rows.

A ``list<int32>`` column (``tokens``, ``input_ids``) comes out of the loader as a list of 1-D
tensors (:mod:`lance_prefetch.convert`). :class:`PadTokens` and :class:`PackTokens` turn it into
what a model takes, batch by batch: as ``PrefetchLoader(transform=...)`` (they run in the read
threads, and pickle into DataLoader workers), as ``LanceMapDataset(transform=...)``, or called on
a batch dict. Each returns a new dict: the column's entry replaced by the tensors below, the
other entries (``id``, labels, ...) as they were, one per document.

=======================  ===================================  ================================
key                      :class:`PadTokens`                   :class:`PackTokens`
=======================  ===================================  ================================
the column's name [1]_   ``(rows, length)``, column's dtype   ``(packed, seq_len)``, its dtype
``attention_mask``       ``(rows, length)`` int64, 1 = token  ``(packed, seq_len)`` int64
``labels`` [2]_          int64, ``-100`` on padding           int64, ``-100`` on each
                                                              document's first token, padding
``position_ids``                                              ``(packed, seq_len)`` int64
``seq_idx``                                                   ``(packed, seq_len)`` int32
``cu_seq_lens_q``/``_k``                                      ``(segments + 1,)`` int32
``max_length_q``/``_k``                                       ``int``
=======================  ===================================  ================================

.. [1] ``key="input_ids"`` puts it under another name (the column's own entry is then dropped).
.. [2] Only with ``labels_key="labels"``; ``mask_key=None`` leaves the mask out.

The names and dtypes are Hugging Face's (``tokenizer.pad``, ``DataCollatorWithPadding``,
``DataCollatorWithFlattening``), so a Hugging Face model takes them by name, and the packed
boundaries are FlashAttention's ``flash_attn_varlen_func`` arguments (``cu_seqlens_q``,
``max_seqlen_q``).

**Padding** goes to the batch's longest row (rounded up to ``pad_to_multiple_of``), or to a fixed
``max_length``. A row longer than ``max_length`` is a ``ValueError`` naming the column, the longest
row and both lengths, unless ``truncation=True`` cuts it (never silently). Rows already all of that
length come back as a view of the column's buffer, without a copy.

**Packing** lays the batch's documents (rows) end to end, in the batch's order, and cuts that
stream into rows of ``seq_len`` tokens: every token of the batch exactly once, in order; a
document may continue from the end of one packed row into the next; only the last packed row is
padded (at its end; ``ceil(tokens / seq_len)`` rows, none for a batch without tokens). The
boundaries are of the flattened stream (``input_ids.view(-1)``): ``position_ids`` count from 0 at
each document's first token, through a row break; ``seq_idx`` is the document's row in the batch
(``batch["id"][seq_idx]`` names it), ``len(batch)`` for padding; ``cu_seq_lens`` mark where each
non-empty document starts, then the end of the tokens, then (if any) the end of the padding,
which counts as one more segment (as Hugging Face derives boundaries from ``position_ids``).

**Resume stays exact.** Both work within one batch: packing never carries a token into the next
batch, so each batch is a function of its own rows, and ``state_dict``/``load_state_dict``
resume it as the rows themselves (nothing more is recorded; the packed rows per batch vary).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from lance_prefetch._validate import check_bool, check_choice, check_int, check_key, check_number
from lance_prefetch.convert._sequences import (
    IGNORE_INDEX,
    check_pad_value,
    flatten,
    pack,
    pad,
    truncate,
)

__all__ = ["PackTokens", "PadTokens"]

_SIDES = ("right", "left")
#: the keys PackTokens(boundaries=True) writes besides the tokens, the mask and the labels
_BOUNDARY_KEYS = (
    "position_ids",
    "seq_idx",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
)


@dataclasses.dataclass(frozen=True)
class PadTokens:
    """Pad the variable-length list column ``column`` of each batch into a ``(rows, length)``
    tensor and its ``attention_mask``, as Hugging Face's ``tokenizer.pad`` does.

    Args:
        column (str): the column to pad (a ``list<int>`` column: a list of 1-D tensors; also a
            ``(rows, d)`` tensor or a pyarrow list array).
        max_length (int, optional): pad every row to this length, ``>= 1``. Default: ``None``,
            to the batch's longest row.
        truncation (bool): cut rows longer than ``max_length`` to it; ``False``: such a row is a
            ``ValueError``. Default: ``False``.
        truncation_side (str): ``"right"`` keeps a row's first ``max_length`` tokens, ``"left"``
            its last. Default: ``"right"``.
        pad_value (int | float): the padding token (a tokenizer's ``pad_token_id``); must fit the
            column's dtype. Default: ``0``.
        padding_side (str): ``"right"`` pads after the tokens, ``"left"`` before (for
            generation). Default: ``"right"``.
        pad_to_multiple_of (int, optional): without ``max_length``, round the batch's longest
            row up to a multiple of this. Default: ``None``.
        key (str, optional): the padded tensor's key. Default: ``None``, ``column``'s own.
        mask_key (str, optional): the mask's key; ``None``: no mask. Default:
            ``"attention_mask"``.
        labels_key (str, optional): also return int64 labels under this key (``"labels"``): the
            tokens, ``-100`` on padding. Default: ``None``, no labels.

    Calling it on a batch (a mapping) returns a new dict (see :mod:`lance_prefetch.convert.tokens`);
    :meth:`pad` takes the sequences alone.

    Raises:
        TypeError, ValueError: at construction, a wrong option (named, with the fix); at a
            batch (from the loader: a ``BatchLoadError`` with it as the cause), a row longer
            than ``max_length`` without ``truncation``, a null row, a ``pad_value`` the
            column's dtype cannot hold, a missing column or a key the batch holds already.
    """

    column: str
    _: dataclasses.KW_ONLY
    max_length: int | None = None
    truncation: bool = False
    truncation_side: str = "right"
    pad_value: int | float = 0
    padding_side: str = "right"
    pad_to_multiple_of: int | None = None
    key: str | None = None
    mask_key: str | None = "attention_mask"
    labels_key: str | None = None

    def __post_init__(self) -> None:
        _check_common(self)
        if self.max_length is not None:
            _set(self, "max_length", check_int("max_length", self.max_length, minimum=1))
        _set(self, "truncation", check_bool("truncation", self.truncation))
        check_choice("truncation_side", self.truncation_side, _SIDES)
        check_choice("padding_side", self.padding_side, _SIDES)
        if self.truncation and self.max_length is None:
            raise ValueError(
                "truncation=True cuts rows to max_length, but max_length=None; pass max_length"
            )
        if self.pad_to_multiple_of is not None:
            _set(
                self,
                "pad_to_multiple_of",
                check_int("pad_to_multiple_of", self.pad_to_multiple_of, minimum=1),
            )
            if self.max_length is not None:
                raise ValueError(
                    f"pad_to_multiple_of={self.pad_to_multiple_of} rounds the batch's longest "
                    f"row, but max_length={self.max_length} fixes the length; pass one of them"
                )

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` with :attr:`column` padded (a new dict; ``batch`` is left as it is)."""
        return _replace(batch, self.column, self.pad(_get(batch, self.column, self)))

    def pad(self, sequences: Any) -> dict[str, Any]:
        """The padded tensor, its mask and labels of ``sequences`` (what the column holds), under
        their keys."""
        flat = flatten(sequences, self.column)
        check_pad_value(self.pad_value, flat.values.dtype, "pad_value", self.column)
        longest = int(flat.lengths.max()) if len(flat.lengths) else 0
        width = self.max_length
        if width is None:
            multiple = self.pad_to_multiple_of or 1
            width = -(-longest // multiple) * multiple
        elif longest > width:
            if not self.truncation:
                row = int(flat.lengths.argmax())
                raise ValueError(
                    f"column {self.column!r}: row {row} of the batch has {longest} tokens, more "
                    f"than max_length={width}; pass truncation=True to cut rows to max_length "
                    f"(truncation_side={self.truncation_side!r}), or a larger max_length"
                )
            flat = truncate(flat, width, self.truncation_side)
        padded, mask = pad(flat, width, self.pad_value, self.padding_side)
        out = {self.key or self.column: padded}
        if self.mask_key is not None:
            out[self.mask_key] = mask.to(torch.int64)
        if self.labels_key is not None:
            out[self.labels_key] = padded.to(torch.int64).masked_fill(~mask, IGNORE_INDEX)
        return out


@dataclasses.dataclass(frozen=True)
class PackTokens:
    """Pack the documents (rows) of the variable-length list column ``column`` of each batch
    end to end into rows of ``seq_len`` tokens, with their boundaries (see
    :mod:`lance_prefetch.convert.tokens` for the algorithm and every key), as Hugging Face's
    ``DataCollatorWithFlattening`` names them.

    Args:
        column (str): the column to pack (a list of 1-D tensors, a ``(rows, d)`` tensor or a
            pyarrow list array).
        seq_len (int): tokens per packed row, ``>= 1``.
        pad_value (int | float): the padding token of the last row; must fit the column's
            dtype. Default: ``0``.
        key (str, optional): the packed tensor's key. Default: ``None``, ``column``'s own.
        mask_key (str, optional): the mask's key (1 = a token, 0 = padding); ``None``: no mask.
            Default: ``"attention_mask"``.
        labels_key (str, optional): also return int64 labels under this key (``"labels"``): the
            tokens, ``-100`` on each document's first token (no prediction across a document
            boundary) and on padding. Default: ``None``, no labels.
        boundaries (bool): return ``position_ids``, ``seq_idx``, ``cu_seq_lens_q``/``_k`` and
            ``max_length_q``/``_k``. Default: ``True``.

    Calling it on a batch (a mapping) returns a new dict; :meth:`pack` takes the sequences
    alone. Packing stays within the batch, so resume is exact as without it.

    Raises:
        TypeError, ValueError: at construction, a wrong option (named, with the fix); at a
            batch, a null row, a ``pad_value`` the column's dtype cannot hold, a missing column
            or a key the batch holds already.
    """

    column: str
    seq_len: int
    _: dataclasses.KW_ONLY
    pad_value: int | float = 0
    key: str | None = None
    mask_key: str | None = "attention_mask"
    labels_key: str | None = None
    boundaries: bool = True

    def __post_init__(self) -> None:
        _check_common(self)
        _set(self, "seq_len", check_int("seq_len", self.seq_len, minimum=1))
        _set(self, "boundaries", check_bool("boundaries", self.boundaries))

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` with :attr:`column` packed (a new dict; ``batch`` is left as it is)."""
        return _replace(batch, self.column, self.pack(_get(batch, self.column, self)))

    def pack(self, sequences: Any) -> dict[str, Any]:
        """The packed tensor, its mask, labels and boundaries of ``sequences``, under their
        keys."""
        flat = flatten(sequences, self.column)
        check_pad_value(self.pad_value, flat.values.dtype, "pad_value", self.column)
        packed = pack(
            flat,
            self.seq_len,
            self.pad_value,
            labels=self.labels_key is not None,
            boundaries=self.boundaries,
        )
        out = {self.key or self.column: packed["input_ids"]}
        if self.mask_key is not None:
            out[self.mask_key] = packed["attention_mask"]
        if self.labels_key is not None:
            out[self.labels_key] = packed["labels"]
        if self.boundaries:
            out["position_ids"], out["seq_idx"] = packed["position_ids"], packed["seq_idx"]
            out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = packed["cu_seq_lens"]
            out["max_length_q"] = out["max_length_k"] = packed["max_length"]
        return out


def _check_common(options: PadTokens | PackTokens) -> None:
    """The options both share: the column, the pad value and the output keys (distinct)."""
    check_key("column", options.column)
    _set(options, "pad_value", check_number("pad_value", options.pad_value))
    for name in ("key", "mask_key", "labels_key"):
        check_key(name, getattr(options, name), none=True)
    keys = [options.key or options.column, options.mask_key, options.labels_key]
    if isinstance(options, PackTokens) and options.boundaries:
        keys += list(_BOUNDARY_KEYS)
    named = [key for key in keys if key is not None]
    repeated = sorted({key for key in named if named.count(key) > 1})
    if repeated:
        raise ValueError(
            f"{type(options).__name__} would write {repeated[0]!r} twice (key, mask_key, "
            f"labels_key and the boundaries' keys must differ); pass another key"
        )


def _set(options: Any, name: str, value: Any) -> None:
    object.__setattr__(options, name, value)  # a frozen dataclass, normalised once


def _get(batch: Mapping[str, Any], column: str, options: Any) -> Any:
    if not isinstance(batch, Mapping):
        raise TypeError(
            f"{type(options).__name__} takes a batch dict, but got a {type(batch).__name__}; "
            f"for the sequences alone, call its {'pad' if isinstance(options, PadTokens) else 'pack'}()"
        )
    if column not in batch:
        raise KeyError(
            f"{type(options).__name__}: the batch has no column {column!r} (its keys: "
            f"{list(batch)}); read it with columns=[..., {column!r}]"
        )
    return batch[column]


def _replace(batch: Mapping[str, Any], column: str, new: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with ``column`` replaced, in its place, by the entries of ``new``."""
    clashes = sorted(key for key in new if key != column and key in batch)
    if clashes:
        raise ValueError(
            f"the batch already has a {clashes[0]!r} entry, which padding or packing column "
            f"{column!r} would overwrite; pass another key (key=, mask_key=, labels_key=), "
            f"boundaries=False, or leave that column out of columns="
        )
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if name == column:
            out.update(new)
        else:
            out[name] = value
    return out
