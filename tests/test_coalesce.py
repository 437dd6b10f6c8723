"""Coalesced takes: the rule for how many batches one take reads, the groups and their split,
and a loader reading groups: the same batches in the same order, one take per group, the
readahead bound in batches, errors at the right batch, resuming mid-group."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from support.helpers import batch_ids, expected_rank_ids, loop_threads, wait_until
from support.sources import tapped

from lance_prefetch import BatchLoadError, Dataset, PrefetchLoader, ReadOptions
from lance_prefetch.cache._gathered import gathered
from lance_prefetch.convert._arrow import to_tensors
from lance_prefetch.loader._config import LoaderConfig
from lance_prefetch.loader._iteration import BatchReader
from lance_prefetch.plan._coalesce import (
    LONE_READ,
    MERGE_GAP,
    REMOTE_LEVEL,
    REMOTE_LEVEL_SPARSE,
    SPARSE_REQUESTS,
    TARGET_ROWS,
    TARGET_ROWS_REMOTE,
    Group,
    coalesce_size,
    fetch_bytes,
    groups,
    remote_max_level,
    remote_target,
    requests_per_row,
    share_size,
    split,
    take_memory,
)
from lance_prefetch.plan.sampling import EpochPlan, PlannedBatch
from lance_prefetch.schedule._tuning import MAX_LEVEL, Bounds
from lance_prefetch.sources._uris import remote


@pytest.mark.parametrize(
    ("batch_size", "readahead", "expected"),
    [
        (64, 8, 4),
        (64, 256, 64),
        (64, 100, 50),
        (100, 256, 41),
        (1024, 8, 4),
        (4096, 8, 1),
        (8192, 8, 1),
        (10, 3, 1),
        (10, 2, 1),
        (10, 1, 1),
        (1, 10_000, TARGET_ROWS),
    ],
)
def test_the_auto_rule(batch_size, readahead, expected):
    """ceil(4096 / batch_size), at most readahead // 2, at least 1."""
    assert coalesce_size("auto", batch_size, readahead) == expected


@pytest.mark.parametrize(
    ("batch_size", "readahead", "expected"),
    [(256, 1000, 64), (64, 1000, 256), (256, 8, 4), (1, 100_000, TARGET_ROWS_REMOTE)],
)
def test_the_auto_rule_on_object_stores(batch_size, readahead, expected):
    """ceil(16384 / batch_size) there, with the same bounds."""
    target = TARGET_ROWS_REMOTE
    assert coalesce_size("auto", batch_size, readahead, target=target) == expected


def test_a_loader_aims_at_larger_takes_on_an_object_store(s3, s3_ids_503, ids_1003):
    """The rule's target follows the dataset's storage and density: 4,096 rows locally; on S3
    what remote_target says (503 rows of 8 bytes: every take is dense, 4,096 too)."""
    options = s3.storage_options()
    assert remote(s3_ids_503) and remote(f"{ids_1003} + {s3_ids_503}") and not remote(ids_1003)
    assert remote_target(503, 8) == TARGET_ROWS
    assert PrefetchLoader(Dataset(s3_ids_503, storage_options=options), 16).coalesce == 4096 // 16
    assert PrefetchLoader(ids_1003, 16).coalesce == 4096 // 16
    assert (
        PrefetchLoader(Dataset(s3_ids_503, storage_options=options), 16, readahead=8).coalesce == 4
    )


@pytest.mark.parametrize(
    ("num_rows", "row_bytes", "expected"),
    [
        (20_000, 520, TARGET_ROWS),  # dense: the smallest take merges already
        (200_000, 520, TARGET_ROWS),
        (2_000_000, 520, 15_870),  # ceil(2e6 * 520 / 65,536): neighbours one merge gap apart
        (2_000_000, 528, 16_114),
        (4_000_000, 520, TARGET_ROWS_REMOTE),  # 31,739 <= 2 x 16,384: capped
        (4_200_000, 520, TARGET_ROWS),  # 33,326 > 2 x 16,384: sparse, growing buys nothing
        (20_000_000, 520, TARGET_ROWS),
        (200_000_000, 8, TARGET_ROWS_REMOTE),  # small rows: dense again
        (20_000_000, None, TARGET_ROWS_REMOTE),  # bytes unknown
    ],
)
def test_the_remote_target_follows_the_density_of_a_take(num_rows, row_bytes, expected):
    assert remote_target(num_rows, row_bytes) == expected


def test_what_a_take_on_an_object_store_fetches_and_holds():
    """One request a row when sparse, few when dense; a lone row fetches LONE_READ bytes, a take
    of every row the dataset's bytes; near the density where neighbours merge, a take fetches
    ~36 times its rows' bytes (2M rows of 520 bytes: 16,384 rows fetch ~311 MB, measured 313 MB
    in docs/benchmarks.md), of which it holds a tenth when the allocator gives freed buffers back
    and half when it does not; local files hold nothing extra."""
    assert requests_per_row(16_384, 2_000_000, 520) == pytest.approx(
        math.exp(-MERGE_GAP * 16_384 / (2_000_000 * 520))
    )
    assert requests_per_row(1, 10**9, 520) == pytest.approx(1.0, abs=1e-6)
    assert requests_per_row(10**6, 10**6, 520) < 1e-50
    assert fetch_bytes(1, 10**9, 520) == pytest.approx(LONE_READ, rel=1e-3)
    assert fetch_bytes(10**6, 10**6, 520) == pytest.approx(520e6)
    assert fetch_bytes(16_384, 2_000_000, 520) == pytest.approx(311_116_000, rel=1e-3)
    assert fetch_bytes(16_384, 2_000_000, 520) / (16_384 * 520) == pytest.approx(36.5, abs=0.1)
    fetched = fetch_bytes(16_384, 2_000_000, 520)
    assert take_memory(16_384, 2_000_000, 520, remote=True) == pytest.approx(fetched / 10)
    held = take_memory(16_384, 2_000_000, 520, remote=True, released=False)
    assert held == pytest.approx(fetched / 2)
    assert take_memory(16_384, 2_000_000, 520, remote=False) == 0.0
    assert take_memory(16_384, 2_000_000, 520, remote=False, released=False) == 0.0


def test_a_2m_row_object_store_source_resolves_to_the_rule_and_the_takes_that_fit():
    """The issue's case: 2M rows of 520 bytes on S3, batches of 256, the defaults: 62 batches a
    take (the rule); a take holds ~28.5 MiB while read besides its 7.9 MiB of rows, so 6 takes
    in flight would fit 256 MiB next to one take's rows being consumed, but an object store
    caps "auto" at 4 for takes whose rows share requests (REMOTE_LEVEL), where an iteration
    starts.
    With the allocator left as it is a take holds ~142 MiB: one in flight. Locally, 16 batches
    and the byte cap of rows alone."""
    config = LoaderConfig(batch_size=256)
    on_s3 = config.resolve(row_bytes=520, num_rows=2_000_000, uri="s3://bucket/d.lance")
    assert on_s3.coalesce == math.ceil(15_870 / 256) == 62
    take_bytes = take_memory(62 * 256, 2_000_000, 520, remote=True)
    assert on_s3.tuner.take_bytes == pytest.approx(take_bytes)
    assert take_bytes / 2**20 == pytest.approx(28.5, abs=0.05)
    rows_bytes = 62 * 256 * 520
    assert (256 * 2**20 - rows_bytes) // (rows_bytes + take_bytes) == 6  # what the bytes allow
    assert on_s3.tuner._max_level() == REMOTE_LEVEL == 4  # what more takes in flight buy
    assert on_s3.tuner.restart() == Bounds(readahead=5 * 62, max_in_flight=4)
    kept = LoaderConfig(batch_size=256, read=ReadOptions(release_memory=False))
    on_s3_kept = kept.resolve(row_bytes=520, num_rows=2_000_000, uri="s3://bucket/d.lance")
    assert on_s3_kept.tuner.take_bytes == pytest.approx(5 * take_bytes)
    assert on_s3_kept.tuner.restart().max_in_flight == 1
    local = config.resolve(row_bytes=520, num_rows=2_000_000, uri="/data/d.lance")
    assert local.coalesce == 16 and local.tuner.take_bytes == 0.0
    assert local.tuner.restart().max_in_flight == 4


@pytest.mark.parametrize(
    ("num_rows", "bytes_allow", "level"),
    [(200_000, 27, REMOTE_LEVEL), (20_000_000, 64, REMOTE_LEVEL_SPARSE)],
)
def test_an_object_store_caps_auto_by_what_more_takes_in_flight_buy(num_rows, bytes_allow, level):
    """200k rows (a dense take: ~310 requests for 4,096 rows) and 20M (a sparse one: a request a
    row): the bytes model would allow 27 and 64 takes in flight, but "auto" goes to 4 and 8 on
    an object store; locally to what the bytes allow; a fixed max_in_flight is kept as given."""
    config = LoaderConfig(batch_size=256)
    on_s3 = config.resolve(row_bytes=520, num_rows=num_rows, uri="s3://bucket/d.lance")
    assert on_s3.coalesce == 16
    rows_bytes = 16 * 256 * 520
    room = (256 * 2**20 - rows_bytes) // (rows_bytes + on_s3.tuner.take_bytes)
    assert min(int(room), MAX_LEVEL) == bytes_allow
    assert on_s3.tuner._max_level() == level
    local = config.resolve(row_bytes=520, num_rows=num_rows, uri="/data/d.lance")
    assert local.tuner._max_level() == MAX_LEVEL  # 16 x 256 rows of 520 bytes: room for 61
    fixed = LoaderConfig(batch_size=256, read=ReadOptions(max_in_flight=16))
    on_s3_fixed = fixed.resolve(row_bytes=520, num_rows=num_rows, uri="s3://bucket/d.lance")
    assert on_s3_fixed.tuner._max_level() == 16  # the level, hence the readahead, may rise to 16


def test_remote_max_level_follows_the_take_density():
    """4 takes in flight where a take's rows share requests, 8 where they make about one a row
    (SPARSE_REQUESTS), 4 when the row bytes are unknown."""
    assert requests_per_row(4096, 200_000, 520) == pytest.approx(0.0757, abs=1e-4)
    assert remote_max_level(4096, 200_000, 520) == REMOTE_LEVEL == 4
    assert requests_per_row(62 * 256, 2_000_000, 520) == pytest.approx(0.3678, abs=1e-4)
    assert remote_max_level(62 * 256, 2_000_000, 520) == REMOTE_LEVEL
    assert requests_per_row(4096, 20_000_000, 520) == pytest.approx(0.9745, abs=1e-4)
    assert remote_max_level(4096, 20_000_000, 520) == REMOTE_LEVEL_SPARSE == 8
    # the boundary: rows whose mean gap m gives exp(-MERGE_GAP / m) = SPARSE_REQUESTS
    rows = 1_000_000 * 520 / (MERGE_GAP / -math.log(SPARSE_REQUESTS))
    assert remote_max_level(math.floor(rows) - 1, 1_000_000, 520) == REMOTE_LEVEL_SPARSE
    assert remote_max_level(math.ceil(rows) + 1, 1_000_000, 520) == REMOTE_LEVEL
    assert remote_max_level(4096, 20_000_000, None) == REMOTE_LEVEL


def test_an_explicit_coalesce_is_kept_up_to_readahead():
    assert coalesce_size(5, 64, 5) == 5
    assert coalesce_size(6, 64, 5) == 5  # a take's batches all hold readahead slots


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (0, ValueError, "coalesce should be an integer >= 1"),
        ("max", TypeError, "'auto' or"),
        (2.0, TypeError, "'auto' or a number"),
        (True, TypeError, "'auto' or a number"),
        (None, TypeError, "'auto' or a number"),
    ],
)
def test_bad_coalesce_values(value, error, match):
    with pytest.raises(error, match=match):
        ReadOptions(coalesce=value)  # the one check, before any I/O


def test_groups_and_split_give_back_each_batch_exactly():
    plan = EpochPlan(num_rows=23, batch_size=3, seed=1, drop_last=False)
    batches = list(plan.rank_batches(0))
    made = list(groups(iter(batches), 3))
    assert [[b.position for b in g.batches] for g in made] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [g.position for g in made] == [0, 3, 6] and [len(g) for g in made] == [3, 3, 2]
    for group in made:
        assert group.indices.tolist() == sum((b.indices.tolist() for b in group.batches), [])
        table = pa.table({"id": group.indices.astype(np.int64)})
        pieces = split(table, group)
        assert [p["id"].to_pylist() for p in pieces] == [b.indices.tolist() for b in group.batches]
    single = next(groups(iter(batches[:1]), 1))
    assert single.indices is batches[0].indices  # one batch: no copy
    assert repr(made[2]) == "Group(positions=[6, 7], rows=5)"


def test_a_small_share_caps_the_batches_a_take():
    assert [share_size(64, share, 4) for share in (0, 1, 8, 9, 100, 10_000)] == [1, 1, 1, 2, 13, 64]
    assert share_size(3, 11, 1) == 3 and share_size(7, 11, 1) == 6


def test_ramped_groups_hold_1_2_4_batches_up_to_the_size():
    batches = list(EpochPlan(num_rows=60, batch_size=3, drop_last=False).rank_batches(0))
    ramped = list(groups(iter(batches), 6, ramp=True))
    assert [len(g) for g in ramped] == [1, 2, 4, 6, 6, 1]  # 20 batches
    assert [b.position for g in ramped for b in g.batches] == list(range(20))
    assert [len(g) for g in groups(iter(batches[:2]), 6, ramp=True)] == [1, 1]


def _group_table(extra: str | None) -> pa.Table:
    rows = 10
    values = np.arange(rows * 6)
    image_type = pa.fixed_shape_tensor(pa.uint8(), (2, 3))
    table = pa.table(
        {
            "id": pa.array(np.arange(rows), pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(values[: rows * 3], pa.float32()), 3),
            "grid": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(values[: rows * 4], pa.int16()), 2), 2
            ),
            "image": pa.ExtensionArray.from_storage(
                image_type,
                pa.FixedSizeListArray.from_arrays(pa.array(values % 256, pa.uint8()), 6),
            ),
        }
    )
    if extra == "text":
        table = table.append_column("text", pa.array([f"row {i}" for i in range(rows)]))
    elif extra == "null float":
        weights = [float(i) for i in range(rows)]
        weights[7] = None
        table = table.append_column("weight", pa.array(weights, pa.float32()))
    return table


def _plain(value):
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), value.nan_to_num(-1.0).tolist())
    return value


@pytest.mark.parametrize("extra", [None, "text", "null float"])
def test_a_group_converts_as_its_batches_one_by_one_would(extra):
    """Each batch of a group: the dtypes, shapes and values of converting that batch alone,
    whether every column is a view (the group converted once, then split), or a column is not
    (strings, a float column holding a null: batch by batch)."""
    table = _group_table(extra)
    assert (gathered(table) is None) == (extra is not None)
    offsets = np.arange(10, dtype=np.uint64)
    batches = tuple(
        PlannedBatch(position, offsets[start:stop])
        for position, (start, stop) in enumerate([(0, 4), (4, 8), (8, 10)])
    )
    group = Group(batches=batches, indices=offsets)
    reader = BatchReader(
        SimpleNamespace(cached=None), epoch=0, transform=None, retry=None, telemetry=None
    )
    results = reader.convert(group, table)
    assert [indices.tolist() for indices, _ in results] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for (_, got), (start, stop) in zip(results, [(0, 4), (4, 8), (8, 10)], strict=True):
        want = to_tensors(table.slice(start, stop - start))
        assert list(got) == list(want) == table.column_names
        assert {k: _plain(v) for k, v in got.items()} == {k: _plain(v) for k, v in want.items()}
    assert results[2][1]["image"].tolist() == [
        [[48, 49, 50], [51, 52, 53]],
        [[54, 55, 56], [57, 58, 59]],
    ]


@pytest.mark.parametrize(
    ("coalesce", "max_in_flight", "sizes"),
    [
        (1, 4, [1] * 11),
        (2, 1, [1, 2, 2, 2, 2, 2]),
        (3, 1, [1, 2, 3, 3, 2]),
        (7, 1, [1, 2, 4, 4]),
        (7, 4, [1, 2, 2, 2, 2, 2]),
    ],
)
def test_a_coalesced_epoch_is_the_plan_with_one_take_per_group(
    ids_1003, coalesce, max_in_flight, sizes
):
    """11 batches: takes of 1, 2, 4, ... batches up to ``coalesce``, and at most
    ceil(11 / (2 * max_in_flight)) (6 with one take in flight, 2 with four)."""
    with tapped() as tap:
        loader = PrefetchLoader(
            ids_1003,
            100,
            drop_last=False,
            readahead=8,
            read=ReadOptions(coalesce=coalesce, max_in_flight=max_in_flight),
        )
    batches = list(loader)
    expected = expected_rank_ids(loader)
    assert batch_ids(batches) == expected  # 11 batches, the last of 3 rows
    assert [b["vector"][:, 0].tolist() for b in batches] == [
        [float(i) for i in e] for e in expected
    ]
    starts = np.cumsum([0, *sizes])
    groups_ = [expected[start:end] for start, end in zip(starts[:-1], starts[1:], strict=True)]
    assert sorted(tap.takes) == sorted(sum(group, []) for group in groups_)


def test_coalesced_takes_on_another_rank(ids_1003):
    """Rank 1 of 2 groups its own 21 batches: takes of 1, 2, then 3 of them, its batches
    exactly."""
    with tapped() as tap:
        loader = PrefetchLoader(
            ids_1003,
            25,
            rank=1,
            world_size=2,
            drop_last=False,
            read=ReadOptions(coalesce=3, max_in_flight=1),
        )
    expected = expected_rank_ids(loader, 1)
    assert batch_ids(loader) == expected and len(expected) == 21
    starts = [0, 1, 3, 6, 9, 12, 15, 18, 21]
    assert sorted(tap.takes) == sorted(
        sum(expected[a:b], []) for a, b in zip(starts[:-1], starts[1:], strict=True)
    )


def test_groups_of_a_dataloader_worker_are_its_own_batches():
    """Worker 1 of 2 groups the batches it reads (1, 3, 5, ...), in its order."""
    plan = EpochPlan(num_rows=1003, batch_size=25, world_size=2, drop_last=False)
    mine = [b.indices.tolist() for b in plan.rank_batches(1, worker_id=1, num_workers=2)]
    shares = list(groups(plan.rank_batches(1, worker_id=1, num_workers=2), 3))
    assert [g.indices.tolist() for g in shares] == [
        sum(mine[i : i + 3], []) for i in range(0, len(mine), 3)
    ]


def test_readahead_counts_batches_not_takes(ids_1003):
    """readahead=6, coalesce=3, a take stalls: at most 6 batches (2 takes) held, never more,
    also while the loop holds the rest of a group it received."""
    with tapped() as tap:
        loader = PrefetchLoader(
            ids_1003, 10, readahead=6, read=ReadOptions(max_in_flight=2, coalesce=3)
        )
    stalled = threading.Event()
    slow = sum((loader.epoch_plan().batch(p).indices.tolist() for p in (6, 7, 8)), [])
    highest = [0]
    iterator = None

    def take(read, indices):
        if iterator is not None:
            highest[0] = max(highest[0], iterator.statistics().held)
        if np.asarray(indices).tolist() == slow:
            stalled.wait(1.0)
        return read(indices)

    tap.take = take
    iterator = iter(loader)
    held = []
    for number, _ in enumerate(iterator):
        statistics = iterator.statistics()
        held.append(statistics.held)
        assert statistics.readahead == 6
        if number == 40:
            break
    iterator.close()
    # 6 held (2 groups of 3 batches) when a take starts while the group of batches 6-8 stalls
    assert highest[0] == 6 and max(held) <= 6


def test_a_failed_coalesced_take_names_its_batches_after_the_ones_before(ids_1003):
    with tapped() as tap:
        loader = PrefetchLoader(ids_1003, 10, read=ReadOptions(coalesce=3, retry=None))
    bad = sum((loader.epoch_plan().batch(p).indices.tolist() for p in (3, 4, 5)), [])

    def take(read, indices):
        if np.asarray(indices).tolist() == bad:
            raise OSError("disk on fire")
        return read(indices)

    tap.take = take
    iterator = iter(loader)
    received = [next(iterator)["id"].tolist() for _ in range(3)]
    assert received == expected_rank_ids(loader)[:3]
    assert loader.state_dict()["position"] == 3  # a checkpoint now resumes at batch 3
    with pytest.raises(BatchLoadError) as info:
        next(iterator)
    assert (info.value.position, info.value.num_rows, info.value.attempts) == (3, 30, 1)
    assert str(info.value).startswith("batches 3-5 (one coalesced take) of epoch 0 (30 rows) from ")
    assert isinstance(info.value.__cause__, OSError)
    # the failed iteration is over: the state is what this loader reads next
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (1, 0)
    assert wait_until(lambda: not loop_threads(), timeout=2.0)


def test_a_failed_conversion_in_a_group_comes_after_the_batches_before_it(ids_1003):
    """The transform fails on batch 4 of the group 3-5: batches 0-3 arrive, then the error for
    batch 4 exactly."""
    plan_ids = expected_rank_ids(PrefetchLoader(ids_1003, 10))
    poisoned = plan_ids[4][0]

    def transform(batch):
        if int(batch["id"][0]) == poisoned:
            raise ValueError("bad row")
        return batch

    loader = PrefetchLoader(ids_1003, 10, transform=transform, read=ReadOptions(coalesce=3))
    iterator = iter(loader)
    assert [next(iterator)["id"].tolist() for _ in range(4)] == plan_ids[:4]
    assert loader.state_dict()["position"] == 4
    with pytest.raises(BatchLoadError) as info:
        next(iterator)
    assert (info.value.position, info.value.num_rows) == (4, 10)
    assert str(info.value).startswith("batch 4 of epoch 0 (10 rows)")
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(StopIteration):
        next(iterator)


def test_resuming_mid_group_reads_exactly_the_rest(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, seed=5, read=ReadOptions(coalesce=4))
    expected = expected_rank_ids(loader)
    iterator = iter(loader)
    first = [next(iterator)["id"].tolist() for _ in range(6)]  # group 0 and half of group 1
    state = loader.state_dict()
    iterator.close()
    assert state["position"] == 6
    resumed = PrefetchLoader(
        ids_1003, 10, seed=5, read=ReadOptions(coalesce=3)
    )  # another grouping: same batches
    resumed.load_state_dict(state)
    assert first + batch_ids(resumed) == expected


def test_closing_mid_group_drops_the_rest(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, read=ReadOptions(coalesce=4))
    iterator = iter(loader)
    next(iterator)
    loader.close()
    with pytest.raises(StopIteration):
        next(iterator)
    assert wait_until(lambda: not loop_threads(), timeout=2.0)


def test_groups_run_concurrently(ids_1003):
    """max_in_flight counts takes: with coalesce=2, readahead=8, max_in_flight=4, four takes of
    two batches each run at once: the first takes wait until four are running (at most 5 s)."""
    running, most = [0], [0]
    lock, four = threading.Lock(), threading.Event()

    def take(read, indices):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            if running[0] == 4:
                four.set()
        four.wait(5)
        four.set()  # fewer ran at once: the assertion below says so, the other takes go on
        with lock:
            running[0] -= 1
        return read(indices)

    with tapped(take=take):
        loader = PrefetchLoader(
            ids_1003, 10, readahead=8, read=ReadOptions(coalesce=2, max_in_flight=4)
        )
    assert batch_ids(loader) == expected_rank_ids(loader)
    assert most[0] == 4


def test_close_from_another_thread_mid_group_ends_the_iteration(ids_1003):
    """close() clears the rest of a group while next() may be reading it: next() then ends the
    iteration (StopIteration), never an IndexError."""
    for _ in range(30):
        loader = PrefetchLoader(ids_1003, 10, readahead=16, read=ReadOptions(coalesce=8))
        iterator = iter(loader)
        next(iterator)
        closer = threading.Thread(target=loader.close)
        closer.start()
        try:
            for _ in iterator:
                pass
        finally:
            closer.join()
        assert iterator.closed


def test_a_group_is_planned_batches():
    batch = PlannedBatch(3, np.array([1, 2], dtype=np.uint32))
    group = Group((batch,), batch.indices)
    assert (group.position, len(group)) == (3, 1)


@pytest.mark.timeout(60)
def test_the_first_batch_waits_for_its_own_take_and_transform_only(ids_1003):
    """Every transform but batch 0's waits until the test lets it go: ``next()`` still returns
    batch 0 (its take holds it alone), and then the epoch is exact."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], transform=lambda b: gate(b))
    expected = expected_rank_ids(loader)
    release = threading.Event()

    def gate(batch):
        if batch["id"].tolist() != expected[0]:
            assert release.wait(30)
        return batch

    assert loader.coalesce == 410  # auto: ceil(4096 / 10) batches a take, after the ramp
    iterator = iter(loader)
    first = next(iterator)
    release.set()
    assert batch_ids([first, *iterator]) == expected


@pytest.mark.timeout(60)
def test_closing_stops_the_transforms_of_a_group_being_converted(ids_1003):
    """Takes of 1, 2, then 4 batches; batch 4's transform (in the take of batches 3-6) waits
    until the test closes the iteration: batches 5 and 6 are never transformed."""
    loader = PrefetchLoader(
        ids_1003,
        10,
        columns=["id"],
        readahead=8,
        transform=lambda b: gate(b),
        read=ReadOptions(coalesce=4, max_in_flight=1),
    )
    expected = expected_rank_ids(loader)
    closed, gated, transformed = threading.Event(), threading.Event(), []

    def gate(batch):
        position = expected.index(batch["id"].tolist())
        transformed.append(position)
        if position == 4:
            gated.set()
            assert closed.wait(30)
        return batch

    before = set(threading.enumerate())
    iterator = iter(loader)
    assert batch_ids([next(iterator) for _ in range(3)]) == expected[:3]
    assert gated.wait(5)
    iterator.close(wait=False)
    closed.set()
    assert wait_until(lambda: not loop_threads())
    for thread in set(threading.enumerate()) - before:  # every thread the iteration started:
        thread.join(10)  # its takes and transforms; none can run batch 5's transform after
        assert not thread.is_alive(), thread
    assert sorted(transformed) == [0, 1, 2, 3, 4]
