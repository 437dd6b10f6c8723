"""Conversion: an Arrow table (one batch) to a ``dict`` of torch tensors, one entry per column.

What each Arrow type becomes (``rows`` = rows in the batch):

=====================================================  ======================================  ========
Arrow type                                             Python value                            copy?
=====================================================  ======================================  ========
int8, int16, int32, int64, uint8, float16/32/64        tensor of the same dtype, ``(rows,)``   no
uint16 / uint32 / uint64                               int32 / int64 / int64 tensor            yes
bool                                                   ``torch.bool`` tensor, ``(rows,)``      yes [1]_
fixed_size_list<T>[d] (T one of the above)             tensor ``(rows, d)``                    as T
fixed_size_list<fixed_size_list<T>[w]>[h] (nested)     tensor ``(rows, h, w)``, and so on      as T
fixed_shape_tensor(T, shape) (Arrow's tensor type)     tensor ``(rows, *shape)`` [2]_          as T
list<T> / large_list<T> (variable length)              ``list`` of ``rows`` tensors            as T
                                                       (``None`` for a null list)
string, large_string, string_view                      ``list[str | None]``                    yes
binary, large_binary, fixed_size_binary, binary_view   ``list[bytes | None]``                  yes
a Lance blob column (stored out of line)               ``list[bytes | None]`` [3]_             yes
struct<a: A, b: B, ...> (each field one of these)      ``dict`` ``{"a": ..., "b": ...}`` [4]_  as A, B
a path into a struct, ``columns=["image.bytes"]``      as its type, key ``"image.bytes"``      as its type
=====================================================  ======================================  ========

.. [1] Arrow packs booleans as bits; torch stores one byte per bool.
.. [2] The storage's flat values buffer as a tensor (zero copy for the zero-copy dtypes, as for
   a fixed-size list), reshaped to the type's (physical, row-major) ``shape``. A type with a
   ``permutation`` gives its logical layout, as Arrow defines it (logical dimension ``i`` is
   physical dimension ``permutation[i]``), as a strided view (``.contiguous()`` copies).
   ``dim_names`` are not kept.
.. [3] Read with Lance's blob API (``read_blobs``), in the batch's order, repeats included. Bytes,
   not Lance's file-like ``BlobFile`` objects: bytes pickle through DataLoader workers, collate as
   lists, and are read inside the loader's timed, retried take (a ``BlobFile`` would read later,
   in the training loop). A batch holds its blobs in memory: size ``readahead`` (or
   ``max_buffer_bytes``) for them.
.. [4] Nested to any depth, each field converted by this table (a Hugging Face ``Image()``
   column, ``struct<bytes: binary, path: string>``, becomes ``{"bytes": [...], "path": [...]}``);
   ``torch``'s ``default_collate`` collates dicts of tensors and lists. A null struct makes its
   fields null (so an integer field then fails, as below).

"No copy" tensors share memory with the Arrow buffers Lance returned (through DLPack). A coalesced
take's batches are slices of one table, so each batch's tensors are their own rows of shared
buffers: writing to them is safe, but a batch kept alive keeps the buffers of its whole take
(``coalesce`` batches) alive; ``.clone()`` what you keep.

Nulls, checked batch by batch: a null float (float16/32/64, also inside a fixed-size or
variable-length list or a tensor) becomes ``NaN`` (and the column is then copied); a null string,
binary, blob or variable-length list becomes ``None``; a null integer or bool (also inside a list),
or a null fixed-size list or tensor, raises ``ValueError`` naming the column, so only the batches
that hold one fail.

Other types (timestamps, dates, decimals, dictionaries, maps, other extension types, lists of
strings or of structs, ...) are refused by :func:`check_schema` before any data is read, naming the
column (or the struct's field, as ``"meta.when"``) and its type; ``transform`` cannot convert
them, since it sees batches already converted. Leave them out of ``columns=`` (for a struct's
field: name its other fields), or store a copy as one of the types above (Lance's ``add_columns``
with an SQL ``CAST`` does that in place; the message gives the call).

Tensors of bytes or strings are the user's business: turn them into tensors in ``transform``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from lance_prefetch.convert._projection import _whole

__all__ = ["check_schema", "fixed_row_bytes", "to_tensors"]

# Arrow types torch has no (fully supported) dtype for: widened, with a copy.
_WIDEN = {pa.uint16(): np.int32, pa.uint32(): np.int64, pa.uint64(): np.int64}
_ZERO_COPY = {
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
}


def _is_number(arrow_type: pa.DataType) -> bool:
    if isinstance(arrow_type, pa.BaseExtensionType):  # some (Lance's blob type) are unhashable
        return False
    return arrow_type in _ZERO_COPY or arrow_type in _WIDEN or pa.types.is_boolean(arrow_type)


def _is_tensor(arrow_type: pa.DataType) -> bool:
    """Arrow's canonical ``fixed_shape_tensor`` extension type, of numbers."""
    return isinstance(arrow_type, pa.FixedShapeTensorType) and _is_number(arrow_type.value_type)


def _is_struct(arrow_type: pa.DataType) -> bool:
    """A struct with at least one field (whose fields :func:`check_schema` checks one by one)."""
    return pa.types.is_struct(arrow_type) and arrow_type.num_fields > 0


def _is_fixed_list_of_numbers(arrow_type: pa.DataType) -> bool:
    while pa.types.is_fixed_size_list(arrow_type):
        arrow_type = arrow_type.value_type
    return _is_number(arrow_type)


def _is_text(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or (getattr(pa.types, "is_string_view", lambda _: False)(arrow_type))
    )


def _is_bytes(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_fixed_size_binary(arrow_type)
        or getattr(pa.types, "is_binary_view", lambda _: False)(arrow_type)
    )


def _is_variable_list(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and (
        _is_fixed_list_of_numbers(arrow_type.value_type)
    )


def _is_supported(arrow_type: pa.DataType) -> bool:
    """Whether a column of this type converts (a struct: if each of its fields does)."""
    if _is_struct(arrow_type):
        return all(_is_supported(field.type) for field in arrow_type)
    return (
        _is_tensor(arrow_type)
        or _is_fixed_list_of_numbers(arrow_type)
        or _is_variable_list(arrow_type)
        or _is_text(arrow_type)
        or _is_bytes(arrow_type)
    )


def check_schema(schema: pa.Schema) -> None:
    """Check that every field of ``schema`` has a conversion (see the module's table).

    Raises:
        TypeError: a field's type has no tensor form; the message names the field (a struct's
            field by its path, ``"meta.when"``), its type and the fix.
    """
    for field in schema:
        _check_field(field, field.name)


def _check_field(field: pa.Field, path: str, parent: pa.Field | None = None) -> None:
    if _is_struct(field.type):  # its fields one by one: the message names the one refused
        for child in field.type:
            _check_field(child, f"{path}.{child.name}", field)
    elif not _is_supported(field.type):
        raise TypeError(
            f"column {path!r} has Arrow type {field.type}, which lance_prefetch cannot turn "
            f"into a tensor, and transform cannot help (it receives batches already converted); "
            f"{_leave_out(path, field, parent)}, or add a converted copy to the dataset once and "
            f"read that instead, {_converted_copy(field, path)}"
        )


def _leave_out(path: str, field: pa.Field, parent: pa.Field | None) -> str:
    others = [child.name for child in parent.type if child.name != field.name] if parent else []
    if not others:
        return "leave it out of columns="
    struct = path.rpartition(".")[0]
    return (
        f"leave it out of columns= (name the other fields of {struct!r} instead: "
        f"{[f'{struct}.{name}' for name in others]})"
    )


def _converted_copy(field: pa.Field, path: str) -> str:
    """How to store a supported copy of ``field`` (at ``path``, dotted inside structs): a Lance
    ``add_columns`` call with an SQL cast where one fits its type, else the types to aim for."""
    arrow_type, parts = field.type, path.split(".")
    if pa.types.is_dictionary(arrow_type):  # the cast decodes it to its values' type
        values = arrow_type.value_type
        target = (
            "STRING"
            if _is_text(values)
            else "BIGINT"
            if pa.types.is_integer(values)
            else "DOUBLE"
            if pa.types.is_floating(values)
            else None
        )
    elif pa.types.is_temporal(arrow_type):  # timestamp, date, time, duration: their integer
        target = "BIGINT"
    elif pa.types.is_decimal(arrow_type):
        target = "DOUBLE"
    else:
        target = None
    suffix = {"STRING": "str", "BIGINT": "int", "DOUBLE": "float"}.get(target or "")
    if target is None or "`" in path:
        return (
            "as integers, floats, bools, (fixed-size) lists of them, tensors, strings or binary "
            "(lance.dataset(uri).add_columns() computes a column from an SQL expression)"
        )
    new = "_".join(parts) + f"_{suffix}"
    expression = f"CAST({'.'.join(f'`{part}`' for part in parts)} AS {target})"
    return f"e.g. lance.dataset(uri).add_columns({{{new!r}: {expression!r}}})"


def to_tensors(table: pa.Table) -> dict[str, Any]:
    """Convert one batch to ``{column name: value}`` following the module's table.

    Args:
        table (pyarrow.Table): the batch, ``rows`` rows; columns of supported types only
            (see :func:`check_schema`).

    Returns:
        dict[str, Any]: one entry per column, in the table's column order. Numeric columns and
        tensors are tensors whose first dimension is ``rows``; strings, binary and variable-length
        lists are Python lists of length ``rows``; a struct is a ``dict`` of its fields, each
        converted so.

    Raises:
        ValueError: an integer or bool column, or a fixed-size list or tensor, holds nulls.
        TypeError: a column type has no conversion.
    """
    return {
        name: _column(name, _whole(column))
        for name, column in zip(table.column_names, table.columns, strict=True)
    }


def _column(name: str, array: pa.Array) -> Any:
    arrow_type = array.type
    if _is_tensor(arrow_type):
        return _tensors(name, array)
    if _is_struct(arrow_type):  # flatten(): each field with the struct's offset and nulls
        children = zip(arrow_type, array.flatten(), strict=True)
        return {field.name: _column(f"{name}.{field.name}", child) for field, child in children}
    if _is_fixed_list_of_numbers(arrow_type):
        return _fixed_lists(name, array)
    if _is_variable_list(arrow_type):
        return _variable_lists(name, array)
    if _is_text(arrow_type) or _is_bytes(arrow_type):
        return array.to_pylist()
    raise TypeError(f"column {name!r} has Arrow type {arrow_type}, which has no tensor form")


def _fixed_lists(name: str, array: pa.Array) -> torch.Tensor:
    rows, dims = len(array), []
    while pa.types.is_fixed_size_list(array.type):
        if array.null_count:
            raise ValueError(
                f"column {name!r} holds {array.null_count} null fixed-size lists in this batch; "
                f"a tensor cannot represent them: fill them in the dataset"
            )
        dims.append(array.type.list_size)
        array = array.flatten()  # respects the slice offset, unlike .values
    return _numbers(name, array).reshape(rows, *dims)


def _tensors(name: str, array: pa.ExtensionArray) -> torch.Tensor:
    """A ``fixed_shape_tensor`` column: its storage (a fixed-size list of ``prod(shape)``
    values, in the type's physical ``shape``) as ``(rows, *shape)``, then its ``permutation``
    applied as a view (logical dimension ``i`` is physical dimension ``permutation[i]``)."""
    arrow_type = array.type
    if array.null_count:
        raise ValueError(
            f"column {name!r} holds {array.null_count} null tensors in this batch; a tensor "
            f"cannot represent them: fill them in the dataset"
        )
    flat = _numbers(name, array.storage.flatten())  # the storage keeps the slice's offset
    tensor = flat.reshape(len(array), *arrow_type.shape)
    permutation = arrow_type.permutation
    if permutation is not None and list(permutation) != sorted(permutation):
        tensor = tensor.permute(0, *(axis + 1 for axis in permutation))
    return tensor


def _variable_lists(name: str, array: pa.Array) -> list[torch.Tensor | None]:
    offsets = array.offsets.to_numpy()  # positions in array.values (which ignores a slice)
    start = int(offsets[0]) if len(offsets) else 0
    # Only this batch's values: a slice of a coalesced take shares its values with the others.
    flat = _column(name, array.values.slice(start, int(offsets[-1]) - start if len(offsets) else 0))
    offsets = offsets - start
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return [flat[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))]


def _numbers(name: str, array: pa.Array) -> torch.Tensor:
    arrow_type = array.type
    if array.null_count:
        if not pa.types.is_floating(arrow_type):
            raise ValueError(
                f"column {name!r} ({arrow_type}) holds {array.null_count} nulls in this batch; "
                f"integer and bool tensors cannot represent them: fill them in the dataset, or "
                f"store the column as floats to get NaN"
            )
        array = pc.fill_null(array, float("nan"))
    if pa.types.is_boolean(arrow_type):
        return torch.from_numpy(array.to_numpy(zero_copy_only=False))  # a fresh, writable array
    if arrow_type in _WIDEN:
        values = array.to_numpy()
        if arrow_type == pa.uint64() and len(values) and values.max() > np.iinfo(np.int64).max:
            raise ValueError(
                f"column {name!r} (uint64) holds values above {np.iinfo(np.int64).max}, which do "
                f"not fit torch.int64"
            )
        return torch.from_numpy(values.astype(_WIDEN[arrow_type]))
    try:
        return torch.from_dlpack(array)  # zero copy, no read-only warning
    except (BufferError, TypeError, NotImplementedError):  # an Arrow build without DLPack export
        return torch.from_numpy(array.to_numpy(zero_copy_only=False).copy())


def fixed_row_bytes(schema: pa.Schema) -> int | None:
    """Bytes a row of ``schema`` takes in Arrow buffers when every column is fixed-width
    (numbers, bools, fixed-size lists and binaries of them), else ``None``."""
    total = 0.0
    for field in schema:
        width = _fixed_bits(field.type)
        if width is None:
            return None
        total += width / 8
    return int(np.ceil(total))


def _fixed_bits(arrow_type: pa.DataType) -> float | None:
    if isinstance(arrow_type, pa.BaseExtensionType):  # a tensor: its fixed-size list
        return _fixed_bits(arrow_type.storage_type)
    if pa.types.is_struct(arrow_type):
        widths = [_fixed_bits(field.type) for field in arrow_type]
        return None if None in widths else float(sum(widths))  # type: ignore[arg-type]
    if pa.types.is_fixed_size_list(arrow_type):
        inner = _fixed_bits(arrow_type.value_type)
        return None if inner is None else inner * arrow_type.list_size
    try:
        return float(arrow_type.bit_width)
    except ValueError:  # variable width
        return None
