"""Tests for lance_prefetch.convert: Arrow batch -> dict of tensors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_prefetch.convert import check_schema, to_tensors


def fixed(values, *sizes):
    array = pa.array(values)
    for size in reversed(sizes):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


@pytest.mark.parametrize(
    "arrow_type,torch_dtype",
    [
        (pa.int8(), torch.int8), (pa.int16(), torch.int16), (pa.int32(), torch.int32),
        (pa.int64(), torch.int64), (pa.uint8(), torch.uint8), (pa.float16(), torch.float16),
        (pa.float32(), torch.float32), (pa.float64(), torch.float64),
    ],
)  # fmt: skip
def test_numbers_are_zero_copy(arrow_type, torch_dtype):
    array = pa.array([1, 2, 3, 4], arrow_type)
    tensor = to_tensors(pa.table({"x": array}))["x"]
    assert tensor.dtype == torch_dtype and tensor.tolist() == [1, 2, 3, 4]
    assert tensor.data_ptr() == array.buffers()[1].address  # shares Arrow's buffer


@pytest.mark.parametrize(
    "arrow_type,torch_dtype", [(pa.uint16(), torch.int32), (pa.uint32(), torch.int64), (pa.uint64(), torch.int64)]
)  # fmt: skip
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
