"""Tests for the column types a source reads (lance_prefetch.convert._projection through LanceSource and
the loader): ``fixed_shape_tensor`` columns, blob columns, nested paths (``"a.b"``) and structs
(a Hugging Face ``Image()`` column), on real Lance datasets whose ``id`` is each row's position,
in every read mode (the ``make_loader`` fixture: per take, coalesced, memory and disk caches)."""

from __future__ import annotations

import io
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import default_collate

from lance_prefetch import LanceMapDataset, MemoryCache, PrefetchLoader, collate
from lance_prefetch.cache._disk import ROWS
from lance_prefetch.sources._lance import LanceSource
from lance_prefetch.sources._options import SourceOptions

BLOB = {"lance-encoding:blob": "true"}


def tensor_of(ids) -> torch.Tensor:
    """Row ``id``'s tensor: ``id * 6 + [[0, 1, 2], [3, 4, 5]]`` (float32, shape (2, 3))."""
    ids = torch.as_tensor(ids, dtype=torch.float32)
    return ids[:, None, None] * 6 + torch.arange(6, dtype=torch.float32).reshape(2, 3)


@pytest.fixture(scope="module")
def tensors_50(tmp_path_factory) -> str:
    """50 rows in 3 fragments (20, 20, 10): ``id`` and ``t``, a ``fixed_shape_tensor(float32,
    (2, 3))`` of :func:`tensor_of`."""
    values = tensor_of(np.arange(50)).numpy().reshape(-1)
    storage = pa.FixedSizeListArray.from_arrays(pa.array(values), 6)
    t = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), (2, 3)), storage)
    uri = str(tmp_path_factory.mktemp("tensors") / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(50), "t": t}), uri, max_rows_per_file=20)
    return uri


def blob_of(i: int) -> bytes | None:
    """Row ``i``'s blob: distinct bytes of varying length (empty for row 0, null for row 13)."""
    return None if i == 13 else b"%d:" % i * (i % 5) if i else b""


def write_blobs(path, *, version: str | None = None) -> str:
    """60 rows in 3 fragments of 20: ``id``, ``blob`` (large binary stored out of line) and
    ``label`` (``id % 7``). ``version``: Lance's file format (``"2.0"``: the legacy blob form;
    default: blob v2)."""
    schema = pa.schema(
        [
            ("id", pa.int64()),
            pa.field("blob", pa.large_binary(), metadata=BLOB),
            ("label", pa.int64()),
        ]
    )
    ids = np.arange(60)
    table = pa.table(
        {"id": ids, "blob": [blob_of(i) for i in ids], "label": ids % 7}, schema=schema
    )
    lance.write_dataset(table, str(path), max_rows_per_file=20, data_storage_version=version)
    return str(path)


@pytest.fixture(scope="module")
def blobs_60(tmp_path_factory) -> str:
    return write_blobs(tmp_path_factory.mktemp("blobs") / "b.lance")


def image_of(i: int) -> dict:
    return {"bytes": b"\x89PNG-%d" % i, "path": f"img/{i}.png"}


@pytest.fixture(scope="module")
def nested_40(tmp_path_factory) -> str:
    """40 rows in 2 fragments: ``id``; ``image``, ``struct<bytes: binary, path: string>`` (as
    :func:`image_of`); ``meta``, ``struct<n: int64 (= id * 10), inner: struct<score: float32 (=
    id / 2), v: fixed_size_list<int32>[2] (= [id, -id])>>``."""
    ids = np.arange(40)
    image = pa.array(
        [image_of(i) for i in ids], pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    )
    v = pa.FixedSizeListArray.from_arrays(
        pa.array(np.stack([ids, -ids], 1).reshape(-1), pa.int32()), 2
    )
    inner = pa.StructArray.from_arrays([pa.array(ids / 2, pa.float32()), v], names=["score", "v"])
    meta = pa.StructArray.from_arrays([pa.array(ids * 10), inner], names=["n", "inner"])
    uri = str(tmp_path_factory.mktemp("nested") / "n.lance")
    lance.write_dataset(
        pa.table({"id": ids, "image": image, "meta": meta}), uri, max_rows_per_file=25
    )
    return uri


def epoch(loader) -> tuple[list[dict], list[int]]:
    batches = list(loader)
    return batches, [i for batch in batches for i in batch["id"].tolist()]


# -- fixed_shape_tensor ----------------------------------------------------------------------------


def test_tensor_columns_are_batch_by_shape_tensors_in_every_read_mode(make_loader, tensors_50):
    """Every row once, each batch's ``t`` the written values of exactly its ids, ``(5, 2, 3)``
    float32, in permutation order (coalesced mode: 4 batches a take, readahead 8)."""
    loader = make_loader(tensors_50, 5, seed=3, readahead=8)
    assert loader.coalesce == (1 if make_loader.mode == "per-take" else 4)
    batches, ids = epoch(loader)
    assert ids == loader.epoch_plan().permutation.tolist() and sorted(ids) == list(range(50))
    for batch in batches:
        assert batch["t"].dtype == torch.float32 and batch["t"].shape == (5, 2, 3)
        assert torch.equal(batch["t"], tensor_of(batch["id"]))


def test_a_tensor_columns_size_is_known_before_any_read(tensors_50):
    """The memory cache's check before the scan counts a tensor row's bytes (8 + 6 x 4)."""
    with pytest.raises(ValueError, match=r"need 1,600 bytes .* above max_bytes=1000 "):
        PrefetchLoader(tensors_50, 5, cache=MemoryCache(max_bytes=1000))


# -- blobs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.0", None], ids=["legacy-blob", "blob-v2"])
def test_blobs_are_read_in_the_order_asked_repeats_included(tmp_path, version):
    """An unsorted take with repeats across the three fragments returns each offset's bytes in
    that order (an empty blob as ``b""``, a null as ``None``), with or without other columns,
    and offsets stay offsets among live rows after a delete."""
    uri = write_blobs(tmp_path / "b.lance", version=version)
    indices = np.array([45, 3, 3, 59, 20, 13, 0, 45, 21, 19])
    source = LanceSource(uri, SourceOptions(columns=["blob", "id"]))
    assert source.schema.field("blob").type == pa.large_binary()
    table = source.take(indices)
    assert table.column_names == ["blob", "id"]
    assert table.column("id").to_pylist() == indices.tolist()
    assert table.column("blob").to_pylist() == [blob_of(i) for i in indices]
    only = LanceSource(uri, SourceOptions(columns=["blob"])).take(indices)
    assert only.column("blob").to_pylist() == [blob_of(i) for i in indices]
    batch = collate(LanceMapDataset(uri, columns=["id", "blob"]).__getitems__(indices))
    assert batch["id"].tolist() == indices.tolist()
    assert batch["blob"] == [blob_of(i) for i in indices]
    lance.dataset(uri).delete("id = 2")  # offset 2 is now id 3
    after = LanceSource(uri, SourceOptions(columns=["id", "blob"])).take(np.array([2, 40, 2]))
    assert after.column("id").to_pylist() == [3, 41, 3]
    assert after.column("blob").to_pylist() == [blob_of(3), blob_of(41), blob_of(3)]


def test_fewer_blobs_than_offsets_is_a_short_read(blobs_60, monkeypatch):
    """Blobs missing from Lance's answer are a ``ShortReadError`` (never retried), not a
    shorter batch."""
    from lance_prefetch.sources import _lance as _source
    from lance_prefetch.sources._lance import ShortReadError

    read = _source._read_blobs
    monkeypatch.setattr(_source, "_read_blobs", lambda *args: read(*args)[:-1])
    source = LanceSource(blobs_60, SourceOptions(columns=["id", "blob"]))
    with pytest.raises(
        ShortReadError, match=r"^Lance returned 2 rows for 3 offsets from '.*b\.lance' version 1$"
    ):
        source.take(np.array([5, 45, 5]))


def test_blob_columns_through_the_loader_in_every_read_mode(make_loader, blobs_60):
    """Each batch's ``blob`` is ``list[bytes | None]`` of exactly its ids, also the rows a rank's
    share repeats (60 rows over 7 ranks: rank 6 ends with rank 0's first batch); the caches hold
    the bytes (the disk copy stores them as a blob again). The loader pickles, and its copy
    reads the same."""
    loaders = [
        make_loader(
            blobs_60,
            3,
            columns=["id", "blob", "label"],
            seed=5,
            drop_last=False,
            rank=rank,
            world_size=7,
        )
        for rank in (0, 6)
    ]
    copy = pickle.loads(pickle.dumps(loaders[0]))  # (as into a DataLoader worker)
    (first, first_ids), (last, last_ids) = epoch(loaders[0]), epoch(loaders[1])
    assert len(first_ids) == len(last_ids) == 9 and last_ids[-3:] == first_ids[:3]
    for batch in first + last:
        assert batch["blob"] == [blob_of(i) for i in batch["id"].tolist()]
        assert torch.equal(batch["label"], batch["id"] % 7)
    if make_loader.mode == "disk":
        loaders[0]._source.fill()  # the copy is made in the background: wait for it
        stored = lance.dataset(str(loaders[0]._source.path / ROWS)).schema.field("blob")
        assert stored.type.extension_name == "lance.blob.v2"
    again, again_ids = epoch(copy)
    assert again_ids == first_ids and [b["blob"] for b in again] == [b["blob"] for b in first]


# -- nested paths and structs ----------------------------------------------------------------------


def test_nested_paths_and_structs_in_every_read_mode(make_loader, nested_40):
    """``"image.bytes"`` is the key ``"image.bytes"``; a struct is a nested dict of its fields,
    each converted; a path and a struct named whole beside it (``meta.inner.score``, ``meta``)
    both hold the written values of exactly the batch's ids."""
    columns = ["id", "image.bytes", "meta.inner.score", "meta", "image.path"]
    loader = make_loader(nested_40, 8, columns=columns, seed=1)
    assert loader.columns == tuple(columns)
    batches, ids = epoch(loader)
    assert sorted(ids) == list(range(40))
    for batch in batches:
        ids = batch["id"]
        assert list(batch) == columns
        assert batch["image.bytes"] == [image_of(i)["bytes"] for i in ids.tolist()]
        assert batch["image.path"] == [image_of(i)["path"] for i in ids.tolist()]
        assert torch.equal(batch["meta.inner.score"], ids.float() / 2)
        assert list(batch["meta"]) == ["n", "inner"] and list(batch["meta"]["inner"]) == [
            "score",
            "v",
        ]
        assert torch.equal(batch["meta"]["n"], ids * 10)
        assert torch.equal(batch["meta"]["inner"]["score"], ids.float() / 2)
        assert torch.equal(batch["meta"]["inner"]["v"], torch.stack([ids, -ids], 1).int())


def test_a_source_returns_one_flat_column_per_name(nested_40):
    """Lance's ``take`` nests a path back into its struct and a scan flattens it; the source
    returns the same flat table from both."""
    source = LanceSource(nested_40, SourceOptions(columns=["meta.inner.v", "image", "image.bytes"]))
    assert source.schema.names == ["meta.inner.v", "image", "image.bytes"]
    taken = source.take(np.array([33, 2, 2]))
    scanned = pa.Table.from_batches(source.scan(batch_rows=16)).take([33, 2, 2])
    assert taken.equals(scanned)
    assert taken.column("image").to_pylist() == [image_of(33), image_of(2), image_of(2)]
    assert taken.column("meta.inner.v").to_pylist() == [[33, -33], [2, -2], [2, -2]]


@pytest.mark.parametrize(
    "columns,message",
    [
        (
            ["id", "image.nope"],
            r"^columns: 'image\.nope': no such field in the dataset '.*n\.lance' \(version 1\): the struct 'image' has the fields \['bytes', 'path'\]$",
        ),
        (
            ["id.x"],
            r"^columns: 'id\.x': 'id' in the dataset .* has type int64, not a struct; name 'id' itself$",
        ),
        (
            ["meta.inner.score.z"],
            r"^columns: 'meta\.inner\.score\.z': 'meta\.inner\.score' in .* has type float, not a struct",
        ),
        (
            ["nope.x"],
            r"^columns \['nope\.x'\] are not in the dataset .*; its columns are \['id', 'image', 'meta'\]$",
        ),
    ],
    ids=["no-such-field", "not-a-struct", "deeper", "no-such-column"],
)
def test_bad_paths_are_refused_at_construction_naming_what_exists(nested_40, columns, message):
    """Before any read (a bad path panics inside Lance's take)."""
    with pytest.raises(ValueError, match=message):
        PrefetchLoader(nested_40, 4, columns=columns)


def test_a_blob_inside_a_struct_is_read_by_its_path(tmp_path):
    """``"s.blob"`` reads the bytes; ``"s"`` whole (descriptors, not bytes) is refused, naming
    the paths to read instead."""
    blob = pa.field("blob", pa.large_binary(), metadata=BLOB)
    s = pa.StructArray.from_arrays(
        [pa.array([0, 1, 2]), pa.array([b"a", b"bb", b"ccc"], pa.large_binary())],
        fields=[pa.field("x", pa.int64()), blob],
    )
    uri = str(tmp_path / "nb.lance")
    lance.write_dataset(pa.Table.from_arrays([s], names=["s"]), uri)
    (batch,) = PrefetchLoader(uri, 3, columns=["s.x", "s.blob"], shuffle=False)
    assert batch["s.x"].tolist() == [0, 1, 2] and batch["s.blob"] == [b"a", b"bb", b"ccc"]
    with pytest.raises(
        ValueError,
        match=r"^columns: the struct 's' in the dataset .* holds a blob field, which is read by its path; name its fields instead: \['s\.x', 's\.blob'\]$",
    ):
        PrefetchLoader(uri, 3, columns=["s"])


#: The schema metadata ``datasets`` (4.x) writes for ``{"image": Image(), "label": Value("int64")}``.
HF_METADATA = {
    "huggingface": '{"info": {"features": {"image": {"_type": "Image"}, "label": '
    '{"dtype": "int64", "_type": "Value"}}}}'
}


def test_a_hugging_face_image_column_reads_as_it_is(tmp_path):
    """An HF ``Image()`` column as ``datasets`` writes it (``struct<bytes: binary, path:
    string>`` and its schema metadata; built with pyarrow, as importing ``datasets`` takes
    seconds): the loader's batch is ``{"image": {"bytes": [...], "path": [...]}}``, map-style rows
    collate with torch's ``default_collate``, and the bytes decode as the PNGs written."""
    from PIL import Image

    def png(i: int) -> bytes:
        out = io.BytesIO()
        Image.new("L", (2, 1), color=i).save(out, format="PNG")
        return out.getvalue()

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image_type), ("label", pa.int64())], metadata=HF_METADATA)
    images = [{"bytes": png(i), "path": f"{i}.png"} for i in range(12)]
    uri = str(tmp_path / "hf.lance")
    lance.write_dataset(
        pa.table({"image": images, "label": range(12)}, schema=schema), uri, max_rows_per_file=5
    )
    batches = list(PrefetchLoader(uri, 4, seed=2))
    assert sorted(i for b in batches for i in b["label"].tolist()) == list(range(12))
    for batch in batches:
        labels = batch["label"].tolist()
        assert batch["image"] == {
            "bytes": [png(i) for i in labels],
            "path": [f"{i}.png" for i in labels],
        }
    rows = LanceMapDataset(uri)
    collated = default_collate([rows[i] for i in (5, 0, 5)])
    assert collated["label"].tolist() == [5, 0, 5]
    assert collated["image"] == {
        "bytes": [png(5), png(0), png(5)],
        "path": ["5.png", "0.png", "5.png"],
    }
    decoded = Image.open(io.BytesIO(rows[7]["image"]["bytes"]))
    assert decoded.size == (2, 1) and decoded.getpixel((0, 0)) == 7
