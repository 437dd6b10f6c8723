"""Tests for lance_prefetch.convert: Arrow batch -> dict of tensors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_prefetch.convert._arrow import check_schema, fixed_row_bytes, to_tensors


def fixed(values, *sizes):
    array = pa.array(values)
    for size in reversed(sizes):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


@pytest.mark.parametrize(
    "arrow_type,torch_dtype",
    [
        (pa.int8(), torch.int8),
        (pa.int16(), torch.int16),
        (pa.int32(), torch.int32),
        (pa.int64(), torch.int64),
        (pa.uint8(), torch.uint8),
        (pa.float16(), torch.float16),
        (pa.float32(), torch.float32),
        (pa.float64(), torch.float64),
    ],
)
def test_numbers_are_zero_copy(arrow_type, torch_dtype):
    array = pa.array([1, 2, 3, 4], arrow_type)
    tensor = to_tensors(pa.table({"x": array}))["x"]
    assert tensor.dtype == torch_dtype and tensor.tolist() == [1, 2, 3, 4]
    assert tensor.data_ptr() == array.buffers()[1].address  # shares Arrow's buffer


@pytest.mark.parametrize(
    "arrow_type,torch_dtype",
    [(pa.uint16(), torch.int32), (pa.uint32(), torch.int64), (pa.uint64(), torch.int64)],
)
def test_unsigned_types_torch_lacks_are_widened(arrow_type, torch_dtype):
    tensor = to_tensors(pa.table({"x": pa.array([0, 7, 65535], arrow_type)}))["x"]
    assert tensor.dtype == torch_dtype and tensor.tolist() == [0, 7, 65535]


def test_uint64_too_large_for_int64_is_refused():
    with pytest.raises(ValueError, match="column 'x' \\(uint64\\) holds values above"):
        to_tensors(pa.table({"x": pa.array([2**63], pa.uint64())}))


def test_bool():
    tensor = to_tensors(pa.table({"b": pa.array([True, False, True])}))["b"]
    assert tensor.dtype == torch.bool and tensor.tolist() == [True, False, True]


def test_fixed_size_lists_become_nd_tensors_without_copy():
    values = np.arange(2 * 3 * 4, dtype=np.float32)
    table = pa.table({"vec": fixed(values[:8], 4), "img": fixed(values, 3, 4)})
    out = to_tensors(table)
    assert out["vec"].shape == (2, 4) and out["vec"][1].tolist() == [4, 5, 6, 7]
    assert out["img"].shape == (2, 3, 4) and out["img"].dtype == torch.float32
    assert torch.equal(out["img"], torch.from_numpy(values.reshape(2, 3, 4)))
    assert (
        out["img"].data_ptr()
        == table.column("img").chunk(0).flatten().flatten().buffers()[1].address
    )


def test_slices_respect_the_offset():
    """A sliced batch (offset != 0) converts the rows it shows, not those of the parent."""
    table = pa.table({"x": pa.array(np.arange(10)), "v": fixed(np.arange(20, dtype=np.int32), 2)})
    out = to_tensors(table.slice(3, 2))
    assert out["x"].tolist() == [3, 4]
    assert out["v"].tolist() == [[6, 7], [8, 9]]


def test_slices_of_every_kind_of_column_convert_only_their_rows():
    """A coalesced take is split into slices: each slice converts exactly as a copy of its rows,
    and a null in another slice (here in the first row) fails nothing else."""
    table = pa.table(
        {
            "l": pa.array([[None], [1, 2], [], None, [3]], pa.list_(pa.int32())),
            "f": pa.array([[None], [1.5], [], [2.5, 3.5], None], pa.list_(pa.float32())),
            "s": pa.array([None, "b", "", "d", "e"]),
            "v": fixed(np.arange(10, dtype=np.float32), 2),
        }
    )

    def plain(value):
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value.tolist() if isinstance(value, torch.Tensor) else value

    for start, length in [(1, 1), (1, 2), (2, 3), (3, 2), (4, 1)]:
        sliced = to_tensors(table.slice(start, length))
        copied = to_tensors(table.take(list(range(start, start + length))))
        assert {k: plain(v) for k, v in sliced.items()} == {
            k: plain(v) for k, v in copied.items()
        }, (start, length)
    with pytest.raises(ValueError, match=r"^column 'l' \(int32\) holds 1 nulls"):
        to_tensors(table.slice(0, 1))


def test_strings_binary_and_variable_lists():
    table = pa.table(
        {
            "s": pa.array(["a", None, "ccc"]),
            "b": pa.array([b"\x00", b"", None], pa.large_binary()),
            "l": pa.array([[1, 2], None, [3]], pa.list_(pa.int32())),
        }
    )
    out = to_tensors(table)
    assert out["s"] == ["a", None, "ccc"]
    assert out["b"] == [b"\x00", b"", None]
    assert [t.tolist() if t is not None else None for t in out["l"]] == [[1, 2], None, [3]]
    assert out["l"][0].dtype == torch.int32


def test_float_nulls_become_nan_integer_nulls_are_refused():
    out = to_tensors(pa.table({"f": pa.array([1.0, None], pa.float32())}))
    assert out["f"][0] == 1.0 and torch.isnan(out["f"][1])
    with pytest.raises(ValueError, match=r"^column 'i' \(int64\) holds 1 nulls in this batch"):
        to_tensors(pa.table({"i": pa.array([1, None])}))
    null_list = pa.FixedSizeListArray.from_arrays(
        pa.array([1.0, 2.0]), 1, mask=pa.array([False, True])
    )
    with pytest.raises(ValueError, match=r"^column 'v' holds 1 null fixed-size lists"):
        to_tensors(pa.table({"v": null_list}))


def test_unsupported_types_are_refused_by_name():
    schema = pa.schema([("ok", pa.int64()), ("when", pa.timestamp("us"))])
    with pytest.raises(TypeError) as info:
        check_schema(schema)
    assert str(info.value).startswith(
        "column 'when' has Arrow type timestamp[us], which lance_prefetch cannot turn into a tensor"
    )
    check_schema(pa.schema([("v", pa.list_(pa.list_(pa.float32(), 3)))]))  # list of fixed lists


def test_multiple_chunks_are_combined():
    column = pa.chunked_array([pa.array([1, 2]), pa.array([3])])
    assert to_tensors(pa.table({"x": column}))["x"].tolist() == [1, 2, 3]


# -- tensors, structs and the types still refused --------------------------------------------------


def tensors(values, shape, *, permutation=None, mask=None):
    """A ``fixed_shape_tensor`` array of float32 ``values``, each tensor of physical ``shape``."""
    size = int(np.prod(shape))
    storage = pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), size, mask=mask)
    arrow_type = pa.fixed_shape_tensor(pa.float32(), shape, permutation=permutation)
    return pa.ExtensionArray.from_storage(arrow_type, storage)


def test_fixed_shape_tensors_become_batch_by_shape_tensors_without_copy():
    """``(rows, *shape)`` of the value dtype, sharing the storage's values buffer; a slice (a
    coalesced take's batch) converts its own rows, also without a copy."""
    values = np.arange(4 * 6, dtype=np.float32)
    array = tensors(values, (2, 3))
    out = to_tensors(pa.table({"t": array}))["t"]
    assert out.dtype == torch.float32 and out.shape == (4, 2, 3)
    assert torch.equal(out, torch.from_numpy(values.reshape(4, 2, 3)))
    assert out.data_ptr() == array.storage.flatten().buffers()[1].address
    sliced = to_tensors(pa.table({"t": array}).slice(1, 2))["t"]
    assert torch.equal(sliced, torch.from_numpy(values.reshape(4, 2, 3)[1:3]))
    assert sliced.data_ptr() == array.storage.flatten().buffers()[1].address + 6 * 4
    assert check_schema(pa.schema([("t", array.type)])) is None
    assert fixed_row_bytes(pa.schema([("id", pa.int64()), ("t", array.type)])) == 8 + 6 * 4


def test_a_permuted_tensor_type_is_its_logical_view():
    """The Arrow spec: ``shape`` is the physical (row-major) shape, and logical dimension ``i``
    is physical dimension ``permutation[i]``. (pyarrow 26's ``to_numpy_ndarray`` gives the right
    shape with overlapping strides for this 3-D case, so the reference is numpy's transpose.)"""
    values = np.arange(2 * 24, dtype=np.float32)
    array = tensors(values, (2, 3, 4), permutation=[2, 0, 1])
    out = to_tensors(pa.table({"t": array}))["t"]
    assert out.shape == (2, 4, 2, 3)  # the logical shape: shape[permutation]
    assert np.array_equal(out.numpy(), values.reshape(2, 2, 3, 4).transpose(0, 3, 1, 2))
    assert out.data_ptr() == array.storage.flatten().buffers()[1].address  # a view


def test_tensor_nulls_nan_for_float_values_an_error_for_a_null_tensor():
    values = pa.array([1.0, None, 3.0, 4.0], pa.float32())
    out = to_tensors(pa.table({"t": tensors(values, (2,))}))["t"]
    assert out[0, 0].item() == 1.0 and torch.isnan(out[0, 1]) and out[1].tolist() == [3.0, 4.0]
    null_tensor = tensors(np.arange(4), (2,), mask=pa.array([False, True]))
    with pytest.raises(
        ValueError,
        match=r"^column 't' holds 1 null tensors in this batch; a tensor cannot represent them: fill them in the dataset$",
    ):
        to_tensors(pa.table({"t": null_tensor}))


def test_structs_become_nested_dicts_each_field_converted():
    """An HF ``Image()`` column's shape (``struct<bytes, path>``), and a deeper struct: a dict of
    the fields, each by the table; a null struct makes its fields null."""
    image = pa.StructArray.from_arrays(
        [pa.array([b"\x89PNG0", b"\x89PNG1", None]), pa.array(["0.png", None, "2.png"])],
        names=["bytes", "path"],
    )
    inner = pa.StructArray.from_arrays(
        [pa.array([0.5, 1.5, 2.5], pa.float32()), fixed(np.arange(6, dtype=np.int64), 2)],
        names=["x", "v"],
    )
    outer = pa.StructArray.from_arrays([pa.array([7, 8, 9]), inner], names=["n", "inner"])
    out = to_tensors(pa.table({"image": image, "outer": outer}))
    assert out["image"] == {
        "bytes": [b"\x89PNG0", b"\x89PNG1", None],
        "path": ["0.png", None, "2.png"],
    }
    assert out["outer"]["n"].tolist() == [7, 8, 9]
    assert out["outer"]["inner"]["x"].tolist() == [0.5, 1.5, 2.5]
    assert out["outer"]["inner"]["v"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert to_tensors(pa.table({"image": image}).slice(1, 2))["image"]["path"] == [None, "2.png"]
    nulls = pa.StructArray.from_arrays(
        [pa.array([1.0, 2.0]), pa.array([1, 2])], names=["f", "i"], mask=pa.array([True, False])
    )
    with pytest.raises(ValueError, match=r"^column 's\.i' \(int64\) holds 1 nulls in this batch"):
        to_tensors(pa.table({"s": nulls}))
    assert fixed_row_bytes(pa.schema([("outer", outer.type)])) == 8 + 4 + 16
    assert fixed_row_bytes(pa.schema([("image", image.type)])) is None


def _refusal(name, arrow_type):
    with pytest.raises(TypeError) as info:
        check_schema(pa.schema([("ok", pa.int64()), (name, arrow_type)]))
    return str(info.value)


GENERAL = (
    "or add a converted copy to the dataset once and read that instead, as integers, floats, "
    "bools, (fixed-size) lists of them, tensors, strings or binary (lance.dataset(uri)."
    "add_columns() computes a column from an SQL expression)"
)
REFUSED = [
    ("uuid", pa.uuid(), "column 'u' has Arrow type extension<arrow.uuid>"),
    ("json", pa.json_(), "column 'u' has Arrow type extension<arrow.json>"),
    (
        "list of structs",
        pa.list_(pa.struct([("a", pa.int64())])),
        "column 'u' has Arrow type list<item: struct<a: int64>>",
    ),
    (
        "list of tensors",
        pa.list_(pa.fixed_shape_tensor(pa.float32(), (2,))),
        "column 'u' has Arrow type list<item: extension<arrow.fixed_shape_tensor[value_type=float, shape=[2]]>>",
    ),
    ("empty struct", pa.struct([]), "column 'u' has Arrow type struct<>"),
    ("map", pa.map_(pa.string(), pa.int64()), "column 'u' has Arrow type map<string, int64>"),
]


@pytest.mark.parametrize("what,arrow_type,start", REFUSED, ids=[r[0] for r in REFUSED])
def test_types_still_refused_name_the_column_the_type_and_the_fix(what, arrow_type, start):
    assert _refusal("u", arrow_type) == (
        f"{start}, which lance_prefetch cannot turn into a tensor, and transform cannot help (it "
        f"receives batches already converted); leave it out of columns=, {GENERAL}"
    )


def test_an_unhashable_extension_type_is_refused_by_name_not_crashed_on():
    """Lance's blob type (unhashable) given to check_schema directly: the same refusal, not
    ``TypeError: unhashable type`` (the source reads blob columns as bytes before this check)."""
    from lance.blob import BlobType

    message = _refusal("b", BlobType())
    assert message.startswith(
        "column 'b' has Arrow type extension<lance.blob.v2<BlobType>>, which lance_prefetch "
        "cannot turn into a tensor"
    )
    assert message.endswith(GENERAL)


def test_a_struct_field_refused_is_named_by_its_path_with_its_siblings():
    meta = pa.struct([("n", pa.int64()), ("tags", pa.list_(pa.string())), ("s", pa.string())])
    assert _refusal("meta", meta) == (
        "column 'meta.tags' has Arrow type list<item: string>, which lance_prefetch cannot turn "
        "into a tensor, and transform cannot help (it receives batches already converted); leave "
        "it out of columns= (name the other fields of 'meta' instead: ['meta.n', 'meta.s']), "
        f"{GENERAL}"
    )
