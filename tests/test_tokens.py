"""Token sequences (lance_prefetch.convert.tokens): padding and its mask equal a plain Python reference
(Hugging Face's ``tokenizer.pad`` rules), packing keeps every token of a batch once and in order
with its boundaries, and through a real loader over a Lance dataset the packed batches resume
exactly."""

from __future__ import annotations

import itertools
import json
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch

from lance_prefetch import BatchLoadError, LanceMapDataset, PrefetchLoader, ReadOptions
from lance_prefetch.convert._arrow import to_tensors
from lance_prefetch.convert.tokens import PackTokens, PadTokens

#: a batch of documents as the loader converts a list<int32> column: empty rows included
DOCS = [[5, 6, 7], [], [8], [9, 10, 11, 12, 13], [], [14, 15]]


def batch_of(docs, dtype=None):
    """``{"id", "tokens"}`` as to_tensors makes it from a Lance take: rows are views of one buffer."""
    tokens = pa.array(docs, pa.list_(dtype or pa.int32()))
    table = pa.table({"id": np.arange(len(docs)), "tokens": tokens})
    return to_tensors(table)


def reference_pad(
    docs,
    *,
    max_length=None,
    truncation=False,
    truncation_side="right",
    pad_value=0,
    padding_side="right",
    pad_to_multiple_of=None,
):
    """Padding one row at a time, as Hugging Face's ``tokenizer.pad`` (and its truncation) does."""
    if truncation:
        docs = [d[:max_length] if truncation_side == "right" else d[-max_length:] for d in docs]
    width = max_length
    if width is None:
        width = max((len(d) for d in docs), default=0)
        if pad_to_multiple_of:
            width = (width + pad_to_multiple_of - 1) // pad_to_multiple_of * pad_to_multiple_of
    ids, mask = [], []
    for doc in docs:
        padding = width - len(doc)
        if padding_side == "right":
            ids.append(list(doc) + [pad_value] * padding)
            mask.append([1] * len(doc) + [0] * padding)
        else:
            ids.append([pad_value] * padding + list(doc))
            mask.append([0] * padding + [1] * len(doc))
    return ids, mask


def reference_pack(docs, seq_len, pad_value=0):
    """Packing token by token: the documents end to end, cut every ``seq_len`` tokens."""
    stream = [
        (token, doc, pos) for doc, tokens in enumerate(docs) for pos, token in enumerate(tokens)
    ]
    padding = -len(stream) % seq_len
    stream += [(pad_value, len(docs), pos) for pos in range(padding)]
    rows = [stream[i : i + seq_len] for i in range(0, len(stream), seq_len)]
    real = len(stream) - padding
    cu = [i for i, (_, _, pos) in enumerate(stream) if pos == 0] + [len(stream)]
    return {
        "tokens": [[t for t, _, _ in row] for row in rows],
        "attention_mask": [
            [int(r * seq_len + c < real) for c in range(len(row))] for r, row in enumerate(rows)
        ],
        "position_ids": [[p for _, _, p in row] for row in rows],
        "seq_idx": [[d for _, d, _ in row] for row in rows],
        "cu_seq_lens": cu if stream else [0],
        "max_length": max((b - a for a, b in itertools.pairwise(cu)), default=0),
    }


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize(
    "options",
    [{}, {"max_length": 8}, {"pad_value": 7}, {"pad_to_multiple_of": 4}],
    ids=["longest", "max_length", "pad_value", "multiple"],
)
def test_padding_and_mask_equal_the_reference(padding_side, options):
    """Loader rows (views of one buffer), separate tensors, Arrow and Python lists all pad to the
    reference: values, mask, dtype (the column's; the mask int64), shape."""
    ids, mask = reference_pad(DOCS, padding_side=padding_side, **options)
    pad = PadTokens("tokens", padding_side=padding_side, **options)
    batch = batch_of(DOCS)
    out = pad(batch)
    assert list(out) == ["id", "tokens", "attention_mask"]  # in the column's place
    assert out["id"] is batch["id"]
    assert out["tokens"].dtype == torch.int32 and out["attention_mask"].dtype == torch.int64
    assert out["tokens"].tolist() == ids and out["attention_mask"].tolist() == mask
    table = pa.table({"tokens": pa.array(DOCS, pa.list_(pa.int32()))})
    separate = [torch.tensor(d, dtype=torch.int32) for d in DOCS]
    for sequences in (table["tokens"], table["tokens"].chunk(0), separate):
        assert {k: v.tolist() for k, v in pad.pad(sequences).items()} == {
            "tokens": ids,
            "attention_mask": mask,
        }
    sliced = reference_pad(DOCS[2:], padding_side=padding_side, **options)[0]
    assert pad.pad(table["tokens"].slice(2))["tokens"].tolist() == sliced  # offsets of a slice
    assert pad.pad(DOCS)["tokens"].tolist() == ids  # Python lists: int64
    assert pad.pad(DOCS)["tokens"].dtype == torch.int64
    if "max_length" not in options and "pad_to_multiple_of" not in options:  # torch's own
        torch_padded = torch.nn.utils.rnn.pad_sequence(
            separate,
            batch_first=True,
            padding_value=options.get("pad_value", 0),
            padding_side=padding_side,
        )
        assert torch.equal(out["tokens"], torch_padded)


@pytest.mark.parametrize("side", ["right", "left"])
def test_truncation_cuts_the_named_side_and_is_never_silent(side):
    out = PadTokens("tokens", max_length=2, truncation=True, truncation_side=side)(batch_of(DOCS))
    kept = (
        [[5, 6], [], [8], [9, 10], [], [14, 15]]
        if side == "right"
        else [[6, 7], [], [8], [12, 13], [], [14, 15]]
    )
    assert out["tokens"].tolist() == reference_pad(kept, max_length=2)[0]
    assert out["attention_mask"].tolist() == [[1, 1], [0, 0], [1, 0], [1, 1], [0, 0], [1, 1]]
    with pytest.raises(ValueError) as error:
        PadTokens("tokens", max_length=4)(batch_of(DOCS))
    assert str(error.value) == (
        "column 'tokens': row 3 of the batch has 5 tokens, more than max_length=4; pass "
        "truncation=True to cut rows to max_length (truncation_side='right'), or a larger "
        "max_length"
    )


def test_empty_rows_and_an_all_empty_batch():
    out = PadTokens("tokens")(batch_of([[], [], []]))
    assert out["tokens"].shape == (3, 0) and out["attention_mask"].shape == (3, 0)
    fixed = PadTokens("tokens", max_length=2, pad_value=1)(batch_of([[], []]))
    assert fixed["tokens"].tolist() == [[1, 1], [1, 1]]
    assert fixed["attention_mask"].tolist() == [[0, 0], [0, 0]]
    assert PadTokens("tokens").pad([])["tokens"].shape == (0, 0)
    packed = PackTokens("tokens", 4, labels_key="labels")(batch_of([[], []]))
    assert packed["tokens"].shape == (0, 4) and packed["labels"].shape == (0, 4)
    assert packed["cu_seq_lens_q"].tolist() == [0] and packed["max_length_q"] == 0
    assert packed["seq_idx"].shape == (0, 4) and packed["position_ids"].shape == (0, 4)


def test_rows_already_of_one_length_are_a_view_not_a_copy():
    batch = batch_of([[1, 2, 3], [4, 5, 6]])
    address = batch["tokens"][0].data_ptr()
    assert PadTokens("tokens")(batch)["tokens"].data_ptr() == address
    assert PadTokens("tokens", max_length=3)(batch)["tokens"].data_ptr() == address
    assert PackTokens("tokens", 2)(batch)["tokens"].data_ptr() == address
    assert PackTokens("tokens", 2)(batch)["tokens"].tolist() == [[1, 2], [3, 4], [5, 6]]
    # a slice of a coalesced take, empty rows among its rows: packed without a copy too
    take = pa.table({"tokens": pa.array([[9], [], [1, 2], [], [3], [4]], pa.list_(pa.int32()))})
    rows = to_tensors(take.slice(1, 4))["tokens"]
    packed = PackTokens("tokens", 3).pack(rows)["tokens"]
    assert packed.tolist() == [[1, 2, 3]] and packed.data_ptr() == rows[1].data_ptr()
    fixed = to_tensors(
        pa.table({"v": pa.FixedSizeListArray.from_arrays(pa.array([1, 2, 3, 4]), 2)})
    )
    assert PadTokens("v", max_length=3)(fixed)["v"].tolist() == [[1, 2, 0], [3, 4, 0]]


@pytest.mark.parametrize("seq_len", [1, 4, 5, 21])
def test_packing_equals_the_reference(seq_len):
    """Every token once, in order, rows of exactly seq_len (only the last padded, with its
    mask), position_ids restarting at each document, seq_idx the document's row, cu_seq_lens
    the segments position_ids imply (the padding one more), max_length the longest."""
    expected = reference_pack(DOCS, seq_len, pad_value=99)
    out = PackTokens("tokens", seq_len, pad_value=99)(batch_of(DOCS))
    assert list(out) == [
        "id",
        "tokens",
        "attention_mask",
        "position_ids",
        "seq_idx",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
    ]
    assert out["tokens"].shape == (
        -(-11 // seq_len),
        seq_len,
    )  # 11 tokens and out["tokens"].dtype == torch.int32
    for key in ("tokens", "attention_mask", "position_ids", "seq_idx"):
        assert out[key].tolist() == expected[key], key
    assert out["cu_seq_lens_q"].tolist() == expected["cu_seq_lens"]
    assert out["cu_seq_lens_q"] is out["cu_seq_lens_k"]
    assert out["max_length_q"] == out["max_length_k"] == expected["max_length"]
    assert out["attention_mask"].dtype == out["position_ids"].dtype == torch.int64
    assert out["seq_idx"].dtype == out["cu_seq_lens_q"].dtype == torch.int32
    stream = out["tokens"].view(-1)[out["attention_mask"].view(-1) == 1]
    assert stream.tolist() == [t for doc in DOCS for t in doc]


def test_packed_boundaries_rebuild_every_document_of_random_batches():
    """300 seeded batches: the tokens of each seq_idx are that document, whole and in order, and
    cu_seq_lens is what Hugging Face derives from position_ids (where they are 0, then the end)."""
    rng = np.random.default_rng(18)
    for _ in range(300):
        docs = [
            rng.integers(0, 1000, rng.integers(0, 12)).tolist() for _ in range(rng.integers(1, 9))
        ]
        seq_len = int(rng.integers(1, 16))
        out = PackTokens("tokens", seq_len, labels_key="labels").pack(docs)
        flat = {key: out[key].view(-1) for key in ("tokens", "seq_idx", "position_ids", "labels")}
        for index, doc in enumerate(docs):
            mine = flat["seq_idx"] == index
            assert flat["tokens"][mine].tolist() == doc
            assert flat["position_ids"][mine].tolist() == list(range(len(doc)))
            assert flat["labels"][mine].tolist() == ([-100] + doc[1:] if doc else [])
        starts = torch.nonzero(flat["position_ids"] == 0).view(-1).tolist()
        assert out["cu_seq_lens_q"].tolist() == starts + [flat["tokens"].numel()]
        assert (flat["labels"][out["attention_mask"].view(-1) == 0] == -100).all()


def test_labels_ignore_padding_and_document_starts():
    pad = PadTokens("tokens", labels_key="labels", padding_side="left")(batch_of([[3, 4], [5]]))
    assert pad["labels"].tolist() == [[3, 4], [-100, 5]] and pad["labels"].dtype == torch.int64
    pack = PackTokens("tokens", 3, labels_key="labels", key="input_ids")(batch_of([[3, 4], [5]]))
    assert "tokens" not in pack and pack["input_ids"].tolist() == [[3, 4, 5]]
    assert pack["labels"].tolist() == [[-100, 4, -100]]


@pytest.mark.parametrize(
    "make, error, message",
    [
        (
            lambda: PadTokens("t", truncation=True),
            ValueError,
            "truncation=True cuts rows to max_length, but max_length=None; pass max_length",
        ),
        (
            lambda: PadTokens("t", max_length=0),
            ValueError,
            "max_length should be an integer >= 1, but got max_length=0",
        ),
        (
            lambda: PadTokens("t", padding_side="end"),
            ValueError,
            "padding_side should be one of 'right', 'left', but got padding_side='end'",
        ),
        (
            lambda: PadTokens("t", max_length=8, pad_to_multiple_of=4),
            ValueError,
            "pad_to_multiple_of=4 rounds the batch's longest row, but max_length=8 fixes the "
            "length; pass one of them",
        ),
        (
            lambda: PadTokens("t", pad_value=None),
            TypeError,
            "pad_value should be a number, but got pad_value=None",
        ),
        (
            lambda: PadTokens("t", truncation=1, max_length=2),
            TypeError,
            "truncation should be True or False, but got truncation=1",
        ),
        (
            lambda: PadTokens("t", mask_key="t"),
            ValueError,
            "PadTokens would write 't' twice (key, mask_key, labels_key and the boundaries' keys "
            "must differ); pass another key",
        ),
        (
            lambda: PackTokens("t", 0),
            ValueError,
            "seq_len should be an integer >= 1, but got seq_len=0",
        ),
        (
            lambda: PackTokens("", 4),
            ValueError,
            "column should be a non-empty string, but got column=''",
        ),
        (
            lambda: PackTokens("t", 4, labels_key="position_ids"),
            ValueError,
            "PackTokens would write 'position_ids' twice (key, mask_key, labels_key and the "
            "boundaries' keys must differ); pass another key",
        ),
    ],
    ids=[
        "truncation-alone",
        "max_length-0",
        "side",
        "both-lengths",
        "pad_value-None",
        "truncation-int",
        "same-key",
        "seq_len-0",
        "empty-column",
        "boundary-key",
    ],
)
def test_options_are_checked_at_construction(make, error, message):
    with pytest.raises(error) as raised:
        make()
    assert str(raised.value) == message


def test_bad_batches_are_named():
    with pytest.raises(ValueError) as null:
        PadTokens("tokens")(
            to_tensors(pa.table({"tokens": pa.array([[1], None], pa.list_(pa.int32()))}))
        )
    assert str(null.value) == (
        "column 'tokens': row 1 of the batch is null (None), which has no tokens to pad or pack; "
        "fill it in the dataset (an empty list is a sequence of no tokens)"
    )
    with pytest.raises(ValueError, match=r"^column 'tokens': row 1 of the batch is null"):
        PackTokens("tokens", 2).pack(pa.array([[1], None], pa.list_(pa.int32())))
    with pytest.raises(ValueError) as unfit:
        PadTokens("tokens", pad_value=-100)(batch_of([[1], []], pa.uint8()))
    assert str(unfit.value) == (
        "pad_value=-100 does not fit column 'tokens', whose tokens are torch.uint8; pass a "
        "pad_value that torch.uint8 holds exactly"
    )
    with pytest.raises(
        KeyError, match=r"PackTokens: the batch has no column 'tokens' \(its keys: \['id'\]\)"
    ):
        PackTokens("tokens", 2)({"id": torch.arange(2)})
    with pytest.raises(ValueError, match=r"^the batch already has a 'attention_mask' entry"):
        PadTokens("tokens")({"tokens": [torch.arange(2)], "attention_mask": torch.ones(1)})
    with pytest.raises(TypeError, match=r"^column 'tokens' is a tensor of shape \(4,\)"):
        PadTokens("tokens").pad(torch.arange(4))


def test_options_pickle_for_dataloader_workers():
    for options in (PadTokens("tokens", max_length=4, truncation=True), PackTokens("tokens", 4)):
        copy = pickle.loads(pickle.dumps(options))
        assert copy == options
        assert copy(batch_of(DOCS))["tokens"].tolist() == options(batch_of(DOCS))["tokens"].tolist()


# --- through a real loader over a Lance dataset ---------------------------------------------


def tokens_of(row_id: int) -> list[int]:
    """Row ``row_id``'s document: ``row_id % 9`` tokens (0 to 8), ``row_id * 100 + j``."""
    return [row_id * 100 + j for j in range(row_id % 9)]


@pytest.fixture(scope="module")
def token_rows(tmp_path_factory) -> str:
    """200 rows, ``id`` and ``tokens`` (list<int32>, ``tokens_of(id)``), in fragments of 64."""
    ids = np.arange(200)
    table = pa.table(
        {
            "id": ids,
            "tokens": pa.array([tokens_of(i) for i in ids], pa.list_(pa.int32())),
        }
    )
    uri = str(tmp_path_factory.mktemp("tokens") / "tokens.lance")
    lance.write_dataset(table, uri, max_rows_per_file=64)
    return uri


def plain(batch):
    return {
        key: value.tolist() if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
    }


@pytest.mark.timeout(60)
def test_packed_batches_from_a_loader_hold_every_token_once_and_resume_exactly(token_rows):
    """Batches of 8 rows (coalesced takes of 4 batches), packed into rows of 16: each batch's
    documents rebuild from seq_idx exactly, every id once in the epoch; the state after 9 of 25
    batches, through JSON, gives a new loader exactly the remaining 16 packed batches of an
    uninterrupted run, tensor for tensor."""
    pack = PackTokens("tokens", 16, labels_key="labels")

    def make():
        return PrefetchLoader(
            token_rows,
            8,
            columns=["id", "tokens"],
            seed=5,
            transform=pack,
            read=ReadOptions(coalesce=4),
        )

    loader = make()
    loader.set_epoch(1)
    whole = [plain(batch) for batch in loader]
    assert len(whole) == 25
    seen = []
    for batch in whole:
        tokens = [t for row in batch["tokens"] for t in row]
        seq_idx = [i for row in batch["seq_idx"] for i in row]
        mask = [m for row in batch["attention_mask"] for m in row]
        assert all(len(row) == 16 for row in batch["tokens"])
        for index, row_id in enumerate(batch["id"]):
            assert [t for t, i in zip(tokens, seq_idx, strict=True) if i == index] == tokens_of(
                row_id
            )
        assert sum(mask) == sum(len(tokens_of(i)) for i in batch["id"])
        assert mask == sorted(mask, reverse=True)  # padding only at the end of the last row
        seen += batch["id"]
    assert sorted(seen) == list(range(200))

    interrupted = make()
    interrupted.set_epoch(1)
    iterator = iter(interrupted)
    head = [plain(batch) for batch in itertools.islice(iterator, 9)]
    state = json.loads(json.dumps(interrupted.state_dict()))
    iterator.close()
    assert state["position"] == 9 and state["epoch"] == 1
    resumed = make()
    resumed.load_state_dict(state)
    rest = [plain(batch) for batch in resumed]
    assert head == whole[:9] and rest == whole[9:]


@pytest.mark.timeout(60)
def test_an_over_long_row_fails_its_batch_and_map_style_pads(token_rows):
    """max_length=7 without truncation, in the dataset's order: the batch of ids 8-15 (id 8 has
    8 tokens) raises BatchLoadError caused by the ValueError naming the row; the batch before it
    (read by the same coalesced take) is delivered. The map-style dataset takes the same
    transform."""
    loader = PrefetchLoader(
        token_rows,
        8,
        columns=["id", "tokens"],
        shuffle=False,
        transform=PadTokens("tokens", max_length=7),
    )
    delivered = []
    with pytest.raises(BatchLoadError) as error:
        for batch in loader:
            delivered.append(batch["id"].tolist())
    assert delivered == [list(range(8))]
    assert str(error.value.__cause__) == (
        "column 'tokens': row 0 of the batch has 8 tokens, more than max_length=7; pass "
        "truncation=True to cut rows to max_length (truncation_side='right'), or a larger "
        "max_length"
    )
    dataset = LanceMapDataset(token_rows, columns=["id", "tokens"], transform=PadTokens("tokens"))
    batch = dataset.__getitems__([3, 10, 9]).data
    assert batch["id"].tolist() == [3, 10, 9]
    assert batch["tokens"].tolist() == [[300, 301, 302], [1000, 0, 0], [0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
