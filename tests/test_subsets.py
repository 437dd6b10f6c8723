"""Part of a dataset: ``filter=`` (a Lance SQL predicate) and ``split=`` (a seeded split into named
parts), read with every guarantee of the whole dataset: uniform epochs over the selected rows,
each once, equal batches, ranks, DataLoader workers, resume and elastic resume, the state
refusing another filter or split.

The dataset has deleted rows, so row ids differ from row offsets: the expectations map offsets to
ids through the live rows, never assume them equal.
"""

from __future__ import annotations

import itertools
import json
import pickle

import lance
import numpy as np
import pyarrow as pa
import pytest
from support.contracts import check_resume
from support.fakes import ids_table
from support.helpers import batch_ids, collect

from lance_prefetch import PrefetchLoader, Split
from lance_prefetch.plan.splits import key_hashes, key_parts, part_positions, split_sizes
from lance_prefetch.sources._subset import Subset

FILTER = "label < 4"  # 227 of the 567 live rows
FRACTIONS = {"train": 0.7, "validation": 0.2, "test": 0.1}


def write(path, num_rows: int = 600) -> str:
    """600 rows (:func:`ids_table`) in 4 fragments of 150, with ids 3-5 and 200-229 deleted: 567
    live rows, and from offset 3 on, ids that are not offsets."""
    dataset = lance.write_dataset(ids_table(num_rows), str(path), max_rows_per_file=150)
    dataset.delete("id >= 3 AND id < 6")
    dataset.delete("id >= 200 AND id < 230")
    return str(path)


@pytest.fixture(scope="module")
def holey(tmp_path_factory) -> str:
    return write(tmp_path_factory.mktemp("subsets") / "holey.lance")


@pytest.fixture(scope="module")
def live(holey) -> dict[str, np.ndarray]:
    """The live rows' columns in offset order (row offset ``i`` has id ``live['id'][i]``)."""
    table = lance.dataset(holey).to_table(columns=["id", "label"])
    return {name: table[name].to_numpy() for name in table.column_names}


def ids_of(loader: PrefetchLoader, live, positions) -> list[int]:
    """The ids at plan positions ``positions`` of ``loader`` (through its row offsets)."""
    return live["id"][loader.row_offsets[np.asarray(positions, dtype=np.int64)]].tolist()


def expected(loader: PrefetchLoader, live, rank: int, epoch: int = 0) -> list[list[int]]:
    """What ``rank`` reads in ``epoch``: the pure plan's positions, mapped to ids."""
    plan = loader.epoch_plan(epoch)
    return [ids_of(loader, live, batch.indices) for batch in plan.rank_batches(rank)]


def flat(batches) -> list[int]:
    return [i for batch in batches for i in batch]


# -- filter ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("predicate", "reference"),
    [
        (FILTER, lambda ids, labels: labels < 4),
        ("id % 7 = 1 AND label >= 5", lambda ids, labels: (ids % 7 == 1) & (labels >= 5)),
        ("id IN (0, 1, 2, 6, 230, 599)", lambda ids, labels: np.isin(ids, [0, 1, 2, 6, 230, 599])),
    ],
    ids=["one-column", "two-columns", "in-list"],
)
def test_the_filter_selects_exactly_the_rows_numpy_and_lance_select(
    holey, live, predicate, reference
):
    """The row offsets are those of the matching live rows: equal to a numpy reference over the
    live rows and to Lance's own filtered scan, in dataset order, in the smallest dtype."""
    loader = PrefetchLoader(holey, 10, columns=["id"], filter=predicate, drop_last=False)
    mask = reference(live["id"], live["label"])
    assert loader.row_offsets.dtype == np.uint16  # 567 live rows
    assert loader.row_offsets.tolist() == np.flatnonzero(mask).tolist()
    assert loader.num_rows == int(mask.sum())
    lances = lance.dataset(holey).to_table(filter=predicate, columns=["id"])["id"].to_pylist()
    assert ids_of(loader, live, np.arange(loader.num_rows)) == lances


def test_row_ids_are_not_offsets_once_rows_are_deleted(holey, live):
    """Why the filter's scan projects the predicate instead of reading ``_rowid``: with rows 3-5
    deleted, the row with id 13 is at offset 10, while its ``_rowid`` (and ``_rowaddr``) is 13."""
    dataset = lance.dataset(holey)
    row = dataset.to_table(filter="id = 13", columns=["id"], with_row_id=True)
    assert row["_rowid"].to_pylist() == [13]
    loader = PrefetchLoader(holey, 1, columns=["id"], filter="id = 13")
    assert loader.row_offsets.tolist() == [10]
    assert dataset.take([10], columns=["id"])["id"].to_pylist() == [13]


@pytest.mark.parametrize(
    ("world_size", "drop_last"), [(1, False), (2, False), (3, False), (3, True)]
)
def test_every_matching_row_comes_once_per_epoch_on_every_rank_count(
    holey, live, world_size, drop_last
):
    """Ranks 1/2/3: each rank reads the plan over the 227 matching rows, in equal batches; with
    ``drop_last=False`` every matching id comes once (plus the plan's few padded rows), with
    ``drop_last=True`` none twice, the permutation's tail left out."""
    matching = live["id"][live["label"] < 4].tolist()
    delivered, steps = [], set()
    for rank in range(world_size):
        loader = PrefetchLoader(
            holey,
            10,
            columns=["id"],
            filter=FILTER,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            seed=5,
        )
        batches = collect(loader, epoch=1)
        assert batches == expected(loader, live, rank, epoch=1)
        assert {len(b) for b in batches[:-1]} == {10}
        steps.add(len(batches))
        delivered += flat(batches)
    plan = loader.epoch_plan(1)
    assert len(steps) == 1
    assert len(delivered) == 227 - plan.num_dropped + plan.num_padded
    if drop_last:
        assert len(set(delivered)) == len(delivered) == 210 and set(delivered) <= set(matching)
    else:
        assert sorted(set(delivered)) == matching


@pytest.mark.timeout(60)
def test_a_filter_and_split_read_the_same_through_two_dataloader_workers(holey, live):
    """DataLoader workers (2, spawned fresh): the offsets travel pickled, and the rank reads the
    same batches as without workers, each of the part's rows once."""
    split = Split(fractions=FRACTIONS, name="train", seed=2)
    loader = PrefetchLoader(holey, 10, columns=["id"], filter=FILTER, split=split, drop_last=False)
    in_process = collect(loader, epoch=0)
    assert collect(loader, 2, epoch=0) == in_process == expected(loader, live, 0)
    assert sorted(flat(in_process)) == sorted(ids_of(loader, live, np.arange(loader.num_rows)))


@pytest.mark.parametrize("midpoint", [7])
def test_the_resume_contract_holds_with_a_filter_and_split(make_loader, holey, midpoint):
    """check_resume in every read mode (a memory cache holding only the selected rows, a disk
    copy of the whole version): stopped mid-epoch, the state resumes exactly the rest."""
    split = Split(fractions=FRACTIONS, name="train", seed=2)
    check_resume(
        lambda: make_loader(holey, 10, columns=["id"], filter=FILTER, split=split),
        midpoint=midpoint,
    )


def test_a_memory_cache_holds_the_selected_rows_only(holey, live):
    loader = PrefetchLoader(
        holey, 10, columns=["id"], filter=FILTER, cache="memory", drop_last=False
    )
    assert sorted(flat(collect(loader))) == live["id"][live["label"] < 4].tolist()
    assert loader._source.nbytes == 227 * 8  # int64 ids of the 227 matching rows, not 567


def test_an_elastic_resume_with_a_filter_from_two_ranks_to_three(holey, live):
    """Saved after 4 batches on each of 2 ranks, resumed on 3: over the epoch no matching row
    twice, every one of the permutation's head once (the tail shorter than a round of 3 ranks
    is dropped), the same steps on every new rank."""
    before, states = [], []
    for rank in range(2):
        loader = PrefetchLoader(holey, 10, columns=["id"], filter=FILTER, rank=rank, world_size=2)
        iterator = iter(loader)
        before += flat(batch_ids(itertools.islice(iterator, 4)))
        states.append(json.loads(json.dumps(loader.state_dict())))
        iterator.close()
    assert states[0] == states[1] and states[0]["position"] == 8
    after, steps = [], []
    for rank in range(3):
        loader = PrefetchLoader(holey, 10, columns=["id"], filter=FILTER, rank=rank, world_size=3)
        loader.load_state_dict(states[0])
        batches = collect(loader)
        steps.append(len(batches))
        after += flat(batches)
    delivered = before + after
    assert steps == [4, 4, 4]  # 227 - 80 = 147 rows left: 4 rounds of 30, 27 dropped
    assert len(delivered) == len(set(delivered)) == 200
    head = loader.epoch_plan(0).permutation[:200]
    assert sorted(delivered) == sorted(ids_of(loader, live, head))


def test_a_filter_matching_nothing_is_refused(holey):
    with pytest.raises(ValueError) as info:
        PrefetchLoader(holey, 10, filter="label > 100")
    assert str(info.value) == (
        f"filter='label > 100' matches no row of {holey!r} version 3 (567 rows); check the "
        f"predicate's columns and values (strings in single quotes), or leave filter out"
    )


@pytest.mark.parametrize("predicate", ["true", "1 = 1", "TRUE AND 2 > 1"])
def test_a_constant_true_filter_reads_every_row_as_no_filter_does(holey, predicate):
    """Lance folds a constant to a literal that names no column and refuses a scan of no
    column (was: 'Not supported: Scans must request at least one column ... scanner.rs:...')."""
    loader = PrefetchLoader(holey, 10, columns=["id"], filter=predicate, seed=4)
    whole = PrefetchLoader(holey, 10, columns=["id"], seed=4)
    assert loader.num_rows == whole.num_rows == 567
    assert np.array_equal(loader.row_offsets, np.arange(567))
    assert collect(loader, epoch=1) == collect(whole, epoch=1)


@pytest.mark.parametrize("predicate", ["false", "1 = 0"])
def test_a_constant_false_filter_matches_no_row(holey, predicate):
    with pytest.raises(ValueError) as info:
        PrefetchLoader(holey, 10, filter=predicate)
    assert str(info.value) == (
        f"filter={predicate!r} matches no row of {holey!r} version 3 (567 rows); check the "
        f"predicate's columns and values (strings in single quotes), or leave filter out"
    )


def test_lances_refusal_is_quoted_without_its_rust_source_path(holey):
    with pytest.raises(ValueError) as info:
        PrefetchLoader(holey, 10, filter="label = ")
    assert str(info.value) == (
        "filter='label = ' was refused by Lance: Invalid user input: Expression is not valid: "
        "label =. It must be a Lance SQL predicate over the dataset's columns ['id', 'vector', "
        "'label'], as LanceDataset.scanner(filter=...) takes"
    )
    with pytest.raises(ValueError) as info:  # a constant that is no predicate: named as one
        PrefetchLoader(holey, 10, filter="1")
    assert str(info.value).startswith("filter='1' is not a predicate: Lance evaluates it to int64")


@pytest.mark.parametrize(
    ("predicate", "error", "start"),
    [
        (
            "label = ",
            ValueError,
            "filter='label = ' was refused by Lance: Invalid user input: "
            "Expression is not valid: label =. It must",
        ),
        (
            "colour = 'red'",
            ValueError,
            "filter=\"colour = 'red'\" was refused by Lance: Invalid "
            "user input: Schema error: No field named colour.",
        ),
        (
            "_rowid < 9",
            ValueError,
            "filter='_rowid < 9' was refused by Lance: Invalid user "
            "input: Schema error: No field named _rowid.",
        ),
        (
            "label",
            ValueError,
            "filter='label' is not a predicate: Lance evaluates it to int64 values, not booleans;",
        ),
        ("  ", ValueError, 'filter should be a Lance SQL predicate such as "label = 3"'),
        (3, TypeError, 'filter should be a Lance SQL predicate such as "label = 3"'),
        (
            "label = 3; id > 9",
            ValueError,
            "filter='label = 3; id > 9' holds a ';', but a filter "
            "is one predicate: Lance would read only what comes",
        ),
    ],
    ids=[
        "bad-sql",
        "unknown-column",
        "row-id",
        "not-a-predicate",
        "blank",
        "not-a-string",
        "two-statements",
    ],
)
def test_a_bad_filter_is_refused_naming_it_and_lances_message(holey, predicate, error, start):
    with pytest.raises(error) as info:
        PrefetchLoader(holey, 10, filter=predicate)
    assert str(info.value).startswith(start) and ".rs:" not in str(info.value)
    if "refused by Lance" in start:
        assert str(info.value).endswith(
            "It must be a Lance SQL predicate over the dataset's columns ['id', 'vector', "
            "'label'], as LanceDataset.scanner(filter=...) takes"
        )


def test_a_semicolon_in_a_string_or_at_the_end_is_no_second_statement(holey, live):
    # Lance drops what follows a ';' ("label = 3; id > 9" reads label = 3): refused, unless quoted
    matching = PrefetchLoader(holey, 1, filter="label = 3 AND ';' = ';'", drop_last=False)
    assert matching.num_rows == PrefetchLoader(holey, 1, filter="label = 3 ;").num_rows
    assert matching.num_rows == int(np.count_nonzero(live["label"] == 3))


def test_the_state_records_the_filter_and_split_and_refuses_others(holey):
    split = Split(fractions=FRACTIONS, name="validation", seed=2)
    loader = PrefetchLoader(holey, 5, columns=["id"], filter=FILTER, split=split)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["format_version"] == 5 and state["num_rows"] == 45  # 0.2 of 227 = 45.4
    assert state["filter"] == FILTER
    assert state["split"] == {
        "fractions": [["test", 0.1], ["train", 0.7], ["validation", 0.2]],
        "name": "validation",
        "seed": 2,
        "by": "position",
    }
    PrefetchLoader(holey, 5, columns=["id"], filter=FILTER, split=split).load_state_dict(state)
    other = PrefetchLoader(holey, 5, columns=["id"], filter="label < 5", split=split)
    with pytest.raises(ValueError) as info:
        other.load_state_dict(state)
    assert str(info.value) == (
        "state does not match this loader: filter is 'label < 4' in the state but 'label < 5' "
        "in this loader; num_rows is 45 in the state but 57 in this loader. Build the loader "
        "with the state's values to resume (the same filter and split: the state's positions "
        "count their rows), or start without load_state_dict"
    )
    reseeded = Split(fractions=FRACTIONS, name="validation", seed=3)
    with pytest.raises(
        ValueError,
        match=r"^state does not match this loader: split is \{.*"
        r"'seed': 2, 'by': 'position'\} in the state but \{.*'seed': 3, "
        r"'by': 'position'\} in this loader\. Build",
    ):
        PrefetchLoader(holey, 5, columns=["id"], filter=FILTER, split=reseeded).load_state_dict(
            state
        )
    whole = PrefetchLoader(holey, 5, columns=["id"])
    with pytest.raises(
        ValueError,
        match=r"^state does not match this loader: filter is 'label "
        r"< 4' in the state but None in this loader; split is",
    ):
        whole.load_state_dict(state)
    with pytest.raises(
        ValueError,
        match=r"^state does not match this loader: filter is None in "
        r"the state but 'label < 4' in this loader; split is None",
    ):
        loader.load_state_dict(whole.state_dict())  # a state of the whole dataset


# -- splits ---------------------------------------------------------------------------------------
def test_split_sizes_follow_the_largest_remainder_rule():
    assert split_sizes(101, {"validation": 0.1, "train": 0.9}) == {"train": 91, "validation": 10}
    assert split_sizes(7, {"x": 1 / 3, "y": 1 / 3, "z": 1 / 3}) == {"x": 3, "y": 2, "z": 2}
    assert split_sizes(3, {"train": 0.9, "validation": 0.1}) == {"train": 3, "validation": 0}
    for rows in range(60):
        sizes = split_sizes(rows, FRACTIONS)
        assert sum(sizes.values()) == rows
        assert all(abs(sizes[name] - FRACTIONS[name] * rows) < 1 for name in FRACTIONS)


def test_position_parts_are_disjoint_exactly_sized_and_cover_every_position():
    parts = {
        name: part_positions(1000, Split(fractions=FRACTIONS, name=name, seed=9))
        for name in FRACTIONS
    }
    assert {name: len(part) for name, part in parts.items()} == {
        "train": 700,
        "validation": 200,
        "test": 100,
    }
    assert np.concatenate(list(parts.values())).tolist() != list(range(1000))  # shuffled
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(1000))
    assert all((np.diff(part.astype(np.int64)) > 0).all() for part in parts.values())
    reordered = {"validation": 0.2, "test": 0.1, "train": 0.7}  # the same split
    same = part_positions(1000, Split(fractions=reordered, name="test", seed=9))
    assert same.tolist() == parts["test"].tolist()


def test_a_loaders_parts_cover_the_filtered_rows_read_sequentially_or_shuffled(holey, live):
    """Every part on 3 ranks with ``shuffle=False``: each row of the part once, in dataset
    order across the ranks; shuffled on 2 ranks: the same rows. The parts are disjoint, sized
    by the largest remainder rule, and together the filter's 227 rows, identical on every rank."""
    matching = live["id"][live["label"] < 4].tolist()
    parts = {}
    for name in FRACTIONS:
        split = Split(fractions=FRACTIONS, name=name, seed=4)
        ranks = [
            PrefetchLoader(
                holey,
                8,
                columns=["id"],
                filter=FILTER,
                split=split,
                shuffle=False,
                rank=r,
                world_size=3,
            )
            for r in range(3)
        ]
        assert all(r.row_offsets.tolist() == ranks[0].row_offsets.tolist() for r in ranks)
        part = ids_of(ranks[0], live, np.arange(ranks[0].num_rows))
        read = [collect(loader) for loader in ranks]
        in_order = [b for round_ in itertools.zip_longest(*read) for b in round_ if b]
        assert flat(in_order) == part  # dataset order, once
        shuffled = [
            collect(
                PrefetchLoader(
                    holey,
                    8,
                    columns=["id"],
                    filter=FILTER,
                    split=split,
                    drop_last=False,
                    rank=r,
                    world_size=2,
                )
            )
            for r in range(2)
        ]
        assert sorted(set(flat(shuffled[0] + shuffled[1]))) == part
        parts[name] = part
    assert {name: len(part) for name, part in parts.items()} == split_sizes(227, FRACTIONS)
    assert sorted(flat(parts.values())) == matching  # disjoint, and together every matching row


def test_the_part_depends_on_the_split_seed_not_the_loader_seed(holey):
    def offsets(seed: int, split_seed: int) -> list[int]:
        split = Split(fractions=FRACTIONS, name="validation", seed=split_seed)
        return PrefetchLoader(holey, 5, seed=seed, split=split).row_offsets.tolist()

    assert offsets(0, 1) == offsets(7, 1)
    assert offsets(0, 1) != offsets(0, 2)
    whole = PrefetchLoader(holey, 5, columns=["id"], split=Split(fractions=FRACTIONS, name="test"))
    assert whole.num_rows == 57  # 0.1 of 567, rounded up: a split without a filter


def test_a_key_split_keeps_every_rows_part_when_rows_are_appended(tmp_path):
    """``by="id"``: each row's part is the documented hash of its id, whatever else is in the
    dataset; after an append, the old rows stay in their parts and the parts stay disjoint."""
    uri = str(tmp_path / "grows.lance")
    lance.write_dataset(ids_table(300), uri)

    def part_ids(name: str) -> list[int]:
        split = Split(fractions={"train": 0.8, "validation": 0.2}, name=name, seed=1, by="id")
        return flat(collect(PrefetchLoader(uri, 7, columns=["id"], split=split, shuffle=False)))

    before = {name: part_ids(name) for name in ("train", "validation")}
    split = Split(fractions={"train": 0.8, "validation": 0.2}, name="validation", seed=1, by="id")
    by_hash = np.flatnonzero(key_parts(key_hashes(pa.array(np.arange(300)), 1), split)).tolist()
    assert before["validation"] == by_hash
    assert sorted(before["train"] + before["validation"]) == list(range(300))
    appended = ids_table(400).slice(300)
    lance.write_dataset(appended, uri, mode="append")
    after = {name: part_ids(name) for name in ("train", "validation")}
    for name in before:
        assert [i for i in after[name] if i < 300] == before[name]
    assert sorted(after["train"] + after["validation"]) == list(range(400))
    assert 40 <= len(after["validation"]) <= 120  # binomial around 80


def test_a_key_split_takes_a_struct_field_by_its_path(tmp_path):
    """``by="meta.doc"`` (as ``columns`` and ``filter`` name a struct's field; was refused as no
    such column): the parts are the documented hash of each row's ``meta.doc``, exactly those
    of a top-level copy of it, disjoint, covering every row; rows of a document share a part.
    A path that names no field, or goes through a non-struct, is refused naming it; a row whose
    struct is null has a null key, refused with the filter that leaves it out."""
    ids = np.arange(300)
    docs = ids // 3  # three rows a document

    def write(name: str, null: int | None = None) -> str:
        fields = [pa.array(docs), pa.array([f"t{d}" for d in docs])]
        meta = pa.StructArray.from_arrays(
            fields, names=["doc", "title"], mask=pa.array(ids == null)
        )
        uri = str(tmp_path / name)
        lance.write_dataset(pa.table({"id": ids, "doc": docs, "meta": meta}), uri)
        return uri

    uri, holed = write("docs.lance"), write("holed.lance", null=7)

    def loader(name: str, by: str, source: str = uri, **options) -> PrefetchLoader:
        split = Split(fractions={"train": 0.7, "validation": 0.3}, name=name, seed=5, by=by)
        return PrefetchLoader(source, 4, columns=["id", "meta.doc"], split=split, **options)

    def by_hash(keys: list, name: str) -> list[int]:
        split = Split(fractions={"train": 0.7, "validation": 0.3}, name=name, seed=5, by="x")
        return np.flatnonzero(key_parts(key_hashes(pa.array(keys), 5), split)).tolist()

    parts = {
        name: loader(name, "meta.doc").row_offsets.tolist() for name in ("train", "validation")
    }
    assert parts == {name: by_hash(docs, name) for name in parts}
    assert parts["validation"] == loader("validation", "doc").row_offsets.tolist()
    assert sorted(parts["train"] + parts["validation"]) == ids.tolist()
    assert set(docs[parts["validation"]]).isdisjoint(docs[parts["train"]])
    batches = collect(loader("validation", "meta.doc", shuffle=False, drop_last=False))
    assert sorted(flat(batches)) == parts["validation"]  # ids are offsets here
    titles = [f"t{d}" for d in docs]
    assert loader("train", "meta.title").row_offsets.tolist() == by_hash(titles, "train")
    with pytest.raises(ValueError) as info:
        loader("train", "meta.nope")
    assert str(info.value) == (
        f"split by='meta.nope': no such field in {uri!r} version 1: the struct 'meta' has the "
        f"fields ['doc', 'title']"
    )
    with pytest.raises(ValueError) as info:
        loader("train", "id.doc")
    assert str(info.value) == (
        f"split by='id.doc': 'id' in {uri!r} version 1 has type int64, not a struct; name 'id' "
        f"itself"
    )
    with pytest.raises(ValueError, match=r"^split by='meta': the column is struct<doc: int64, "):
        loader("train", "meta")
    with pytest.raises(ValueError) as info:  # row 7's struct is null: so is its key
        loader("train", "meta.doc", holed)
    assert str(info.value) == (
        "split by='meta.doc': 1 selected rows have a null meta.doc; leave them out with "
        "filter='meta.doc IS NOT NULL'"
    )
    kept = loader("validation", "meta.doc", holed, filter="meta.doc IS NOT NULL")
    assert kept.row_offsets.tolist() == [i for i in parts["validation"] if i != 7]


def test_key_hashes_are_the_documented_formula():
    """The hash written out in :mod:`lance_prefetch.plan.splits`, computed here in Python integers."""
    mask = 2**64 - 1

    def fmix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    def reference(x, seed):
        return fmix(fmix(x) ^ fmix((seed + 0x9E3779B97F4A7C15) & mask))

    def of_bytes(data: bytes) -> int:
        return (
            sum((b + 1) * pow(0x100000001B3, len(data) - 1 - j, 2**64) for j, b in enumerate(data))
            & mask
        )

    words = ["", "a", "héllo", "doc-00017", "x" * 40]
    assert key_hashes(pa.array(words), 3).tolist() == [
        reference(of_bytes(w.encode()), 3) for w in words
    ]
    assert key_hashes(pa.array(words, pa.large_string()).slice(2), 3).tolist() == [
        reference(of_bytes(w.encode()), 3) for w in words[2:]
    ]
    assert key_hashes(pa.array([b"\x00", b""]), 0).tolist() == [reference(1, 0), reference(0, 0)]
    numbers = [0, 1, -1, 2**40]
    assert key_hashes(pa.array(numbers), 8).tolist() == [reference(n & mask, 8) for n in numbers]
    assert key_hashes(pa.array([-1], pa.int32()), 8).tolist() == [reference(mask, 8)]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"fractions": {"train": 0.9, "validation": 0.05}},
            ValueError,
            "Split fractions should sum to 1, but {'train': 0.9, 'validation': 0.05} sum to 0.95; "
            "add a part for the rest (e.g. 'rest': 0.05) if rows should be left out",
        ),
        (
            {"name": "test"},
            ValueError,
            "Split name='test' is not one of the parts ['train', "
            "'validation']; pass one of them (every part is read by its own loader)",
        ),
        (
            {"fractions": {"train": 1.0, "validation": 0}},
            ValueError,
            "Split fractions['validation'] should be in (0, 1], but got 0.0",
        ),
        (
            {"fractions": [0.9, 0.1]},
            TypeError,
            "Split fractions should be a mapping of part "
            "names to fractions, such as {'train': 0.9, 'validation': 0.1}, but got fractions=[0.9, 0.1]",
        ),
        ({"seed": -1}, ValueError, "Split seed should be an integer >= 0, but got Split seed=-1"),
        (
            {"seed": 2**64},
            ValueError,
            "Split seed should be an integer in [0, 2**64), but got Split seed=18446744073709551616; pass a value below 2**64 (e.g. Split seed % 2**64)",
        ),
        ({"by": ""}, ValueError, "Split by should be 'position' or a column name, but got by=''"),
        (
            {"fractions": {"train": 0.9 + 4e-9, "validation": 0.1}},
            ValueError,
            "Split fractions should sum to 1, but {'train': 0.900000004, 'validation': 0.1} sum "
            "to 1.000000004; lower the fractions",
        ),
    ],
    ids=["sum", "name", "zero", "not-a-mapping", "seed", "seed-64", "by", "sum-above-one"],
)
def test_a_bad_split_is_refused_naming_the_field(options, error, message):
    fields = {"fractions": {"train": 0.9, "validation": 0.1}, "name": "train", **options}
    with pytest.raises(error) as info:
        Split(**fields)
    assert str(info.value) == message


def test_unusable_splits_are_refused_at_construction(holey):
    with pytest.raises(ValueError) as info:
        PrefetchLoader(holey, 5, split=Split(fractions=FRACTIONS, name="test", by="doc"))
    assert str(info.value) == (
        f"split by='doc': no such column in {holey!r} version 3; its columns are ['id', "
        f"'vector', 'label'] (or by='position' for exact sizes)"
    )
    with pytest.raises(ValueError, match=r"^split by='vector': the column is fixed_size_list"):
        PrefetchLoader(holey, 5, split=Split(fractions=FRACTIONS, name="test", by="vector"))
    with pytest.raises(ValueError) as info:
        PrefetchLoader(holey, 1, filter="id = 7", split=Split(fractions=FRACTIONS, name="test"))
    assert str(info.value) == (
        f"split: the part 'test' (0.1 of the rows, by 'position') holds no row of {holey!r} "
        f"version 3 matching filter='id = 7'; give it a larger fraction, or read more rows"
    )
    with pytest.raises(TypeError, match=r"^split should be a lance_prefetch.Split or None, but"):
        PrefetchLoader(holey, 5, split={"train": 0.9, "validation": 0.1})


def test_a_subset_pickles_as_the_smaller_of_its_offsets_and_a_bitmap():
    few = Subset(np.array([3, 70_000, 99_999]), 100_000, "x", None)
    many = Subset(np.arange(0, 100_000, 2), 100_000, "x", None)
    assert few.offsets.dtype == np.uint32 and len(pickle.dumps(few)) < 400
    assert len(pickle.dumps(many)) < 100_000 // 8 + 400  # a bitmap, not 200 kB of offsets
    for subset in (few, many):
        copy = pickle.loads(pickle.dumps(subset))
        assert copy.offsets.dtype == np.uint32
        assert copy.offsets.tolist() == subset.offsets.tolist()


def test_the_coverage_audit_checks_a_filtered_epoch(holey):
    loader = PrefetchLoader(holey, 10, columns=["id"], filter=FILTER, audit=True, drop_last=False)
    collect(loader)
    report = loader.audit_report
    assert report.ok and report.rows_delivered == report.rows_expected == 227
