"""The coverage audit (``PrefetchLoader(audit=True)``): the record and the check on their own
(lance_prefetch.audit._bitset, lance_prefetch.audit._coverage), and end to end on every read mode, on two
ranks through ``audit_dir`` and through a real gloo group, through DataLoader workers, with
faults injected through the hand-out seam (``_iteration.deliveries``) and caught with their
exact row ids."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from support.audit_runs import FAULTS, duplicate_in_worker_1, faulty, gloo_rank, read_to_end
from support.helpers import WORKERS, batch_ids, expected_rank_ids, stopping
from torch.utils.data import DataLoader

from lance_prefetch import Audit, AuditReport, CoverageError, PrefetchLoader
from lance_prefetch.audit import _bitset
from lance_prefetch.audit._bitset import CoverageRecord
from lance_prefetch.audit._coverage import Share, ShareCount, check, complete, expected_deliveries
from lance_prefetch.audit._wiring import choose_exchange
from lance_prefetch.loader import _iteration
from lance_prefetch.plan.sampling import EpochPlan

# -- the record and the check, pure --------------------------------------------------------------


def test_the_record_lists_every_repeat_within_and_across_folds(monkeypatch):
    """A row handed out again (in the same batch, among the pending batches, or after a fold)
    is listed once per extra delivery; the bitmap holds each row once."""
    monkeypatch.setattr(_bitset, "FLUSH_ROWS", 4)
    record = CoverageRecord(20)
    for batch in ([3, 3, 9], [9, 1], [17, 0], [3, 19]):
        record.add(np.array(batch, dtype=np.uint8))
    delivered = record.delivered()
    assert _bitset.rows_of(delivered.bits).tolist() == [0, 1, 3, 9, 17, 19]
    assert delivered.repeats.tolist() == [3, 3, 9]
    assert (delivered.batches, delivered.rows) == (4, 9)
    assert len(delivered.bits) == 3 and _bitset.popcount(delivered.bits) == 6


def _records(plan, shares, change=lambda share, batches: batches):
    """Each share's record of ``plan``, its batches passed through ``change`` first."""
    for share in shares:
        record = CoverageRecord(plan.num_rows)
        if share.rank < 0:
            batches = plan.all_batches(
                worker_id=share.worker_id, num_workers=share.num_workers, skip=share.skip
            )
        else:
            batches = plan.rank_batches(
                share.rank,
                worker_id=share.worker_id,
                num_workers=share.num_workers,
                skip=share.skip,
            )
        for batch in change(share, list(batches)):
            record.add(batch.indices)
        yield record.delivered()


def test_the_check_follows_the_rule_padding_resumes_and_worker_skips():
    """Exact on the rule's edge cases: 2 rows padded to 4 ranks (each row due twice), a plan
    resumed at global batch 30 whose padding wraps to rows delivered before the resume, a
    DataLoader worker that resumed its own share, one reader of every rank; and every kind of
    fault is named with its rows."""
    tiny = EpochPlan(num_rows=2, batch_size=5, world_size=4, drop_last=False)
    shares = [Share(r) for r in range(4)]
    report = check(tiny, shares, _records(tiny, shares), uri="u", version=1)
    assert report.ok and (report.rows_expected, report.num_padded) == (4, 2)
    expected = expected_deliveries(tiny)
    assert expected.extra_rows.tolist() == [0, 1] and expected.extra_counts.tolist() == [1, 1]
    lost = check(
        tiny,
        shares,
        _records(tiny, shares, lambda s, b: b if s.rank != 3 else []),
        uri="u",
        version=1,
    )
    row = int(tiny.batch(3).indices[0])
    assert (lost.num_missing, lost.missing, lost.ok) == (1, (row,), False)

    resumed = EpochPlan(num_rows=1003, batch_size=10, world_size=3, drop_last=False, start=30)
    shares = [Share(r) for r in range(3)]
    report = check(resumed, shares, _records(resumed, shares), uri="u", version=1)
    assert report.ok and (report.rows_expected, report.num_padded) == (705, 2)
    covered = set(resumed.permutation[300:].tolist()) | set(resumed.permutation[:2].tolist())
    assert set(_bitset.rows_of(expected_deliveries(resumed).bits).tolist()) == covered

    plan = EpochPlan(num_rows=1003, batch_size=10, world_size=2, drop_last=True)
    workers = [Share(0, 0, 2, skip=6), Share(0, 1, 2, skip=6), Share(1, 0, 1, skip=3)]
    report = check(plan, workers, _records(plan, workers), uri="u", version=1)
    assert report.ok and report.rows_expected == 1000 - 60 - 30
    assert [c.expected_batches for c in report.shares] == [22, 22, 47]
    every = [Share(-1, 0, 2), Share(-1, 1, 2)]
    assert check(plan, every, _records(plan, every), uri="u", version=1).ok

    shares = [Share(0), Share(1)]
    dropped_row = int(plan.permutation[1001])  # in the tail drop_last=True leaves out

    def faults(share, batches):
        if share.rank == 0:  # batch 4 again, batch 9 lost
            return batches[:5] + [batches[4]] + batches[5:9] + batches[10:]
        extra = EpochPlan(num_rows=1003, batch_size=1, start=1001).batch(1001)
        return [*batches, extra]  # a row of the dropped tail

    report = check(plan, shares, _records(plan, shares, faults), uri="u", version=1)
    lost, twice = sorted(plan.batch(18).indices.tolist()), sorted(plan.batch(8).indices.tolist())
    assert report.missing == tuple(lost) and report.num_missing == 10
    assert report.repeated == tuple((row, 2, 1) for row in twice) and report.num_repeated == 10
    assert report.unexpected == (dropped_row,) and report.num_unexpected == 1
    assert report.shares == (ShareCount(Share(0), 50, 500, 50), ShareCount(Share(1), 51, 501, 50))


def test_an_epochs_records_are_complete_when_every_rank_and_worker_is_in():
    assert complete([Share(0), Share(1, 0, 2), Share(1, 1, 2)], world_size=2)
    assert not complete([Share(0), Share(1, 0, 2)], world_size=2)
    assert not complete([Share(0, 0, 1), Share(0, 0, 2), Share(1)], world_size=2)
    assert not complete([Share(1)], world_size=2)
    assert complete([Share(-1, 1, 2), Share(-1, 0, 2)], world_size=3)


# -- end to end ----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_audit_passes_on_every_read_mode(make_loader, ids_1003, caplog):
    """One rank, no workers: checked in place at the epoch's end, every mode; an INFO line."""
    loader = make_loader(ids_1003, 10, columns=["id"], seed=4, audit=True)
    caplog.set_level("INFO", logger="lance_prefetch.audit")
    assert loader.audit_report is None
    assert read_to_end(loader) == (100, None)
    report = loader.audit_report
    assert isinstance(report, AuditReport) and report.ok and report.exact
    assert report.shares == (ShareCount(Share(0), 100, 1000, 100),)
    assert (report.epoch, report.rows_expected, report.rows_delivered) == (0, 1000, 1000)
    assert (report.num_dropped, report.num_padded, report.missing, report.repeated) == (
        3,
        0,
        (),
        (),
    )
    assert [r.getMessage() for r in caplog.records if r.name == "lance_prefetch.audit"] == [
        report.summary()
    ]
    assert report.summary().startswith("coverage audit of epoch 0 passed: ")


@pytest.mark.timeout(60)
def test_two_ranks_through_audit_dir_padded_and_resumed(ids_1003, tmp_path):
    """drop_last=False on 2 ranks: the padded row is due twice. Records meet in audit_dir; the
    rank that writes last checks and writes the report, and the records are removed. Then a
    resume at global batch 20: the audit covers the rows from there (the padding wraps to a row
    delivered before the resume, due once now); the state has no audit record, so the report
    says the rows before the resume are not covered."""

    def make(rank):
        return PrefetchLoader(
            ids_1003,
            10,
            columns=["id"],
            drop_last=False,
            seed=1,
            rank=rank,
            world_size=2,
            audit=Audit(dir=tmp_path),
        )

    first, second = make(0), make(1)
    assert read_to_end(first) == (51, None) and first.audit_report is None  # not all in yet
    assert read_to_end(second) == (51, None)
    report = second.audit_report
    assert report.ok and (report.rows_expected, report.num_padded) == (1004, 1)
    assert sorted(os.listdir(tmp_path)) == [
        "iteration1-report.json",
        "rank0.iterations",
        "rank1.iterations",
    ]
    saved = json.loads((tmp_path / "iteration1-report.json").read_text())
    assert saved["ok"] is True and saved["rows_delivered"] == 1004

    state = first.state_dict()
    assert state["audit"] == [[0, 101]]  # the finished epoch's record: every batch
    state = {k: v for k, v in state.items() if k != "audit"} | {"epoch": 1, "position": 20}
    resumed = [make(rank) for rank in (1, 0)]
    for loader in resumed:
        loader.load_state_dict(state)
    assert [read_to_end(loader) for loader in resumed] == [(41, None), (41, None)]
    report = resumed[1].audit_report  # a state without "audit": the rest of the epoch only
    assert report.ok and (report.epoch, report.start, report.rows_expected) == (1, 20, 804)
    assert report.before is None and "(the rest of the epoch only: " in report.summary()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["duplicated", "dropped"])
def test_the_audit_catches_an_injected_fault_on_two_ranks(fault, ids_1003, tmp_path, monkeypatch):
    """Rank 1 hands its batch 7 out twice, or not at all (through the hand-out seam): rank 1's
    last next() raises CoverageError with exactly that batch's rows, the epoch and the rank;
    rank 0 reads its share normally."""
    loaders = [
        PrefetchLoader(
            ids_1003, 10, columns=["id"], rank=rank, world_size=2, audit=Audit(dir=tmp_path)
        )
        for rank in (0, 1)
    ]
    assert read_to_end(loaders[0]) == (50, None)
    monkeypatch.setattr(_iteration, "deliveries", faulty(1, {0: (1, fault, 7)}))
    batches, error = read_to_end(loaders[1])
    rows = sorted(loaders[1].epoch_plan(0).batch(7 * 2 + 1).indices.tolist())
    report = error.report
    assert isinstance(error, CoverageError) and not report.ok
    assert batches == (51 if fault == "duplicated" else 49)
    if fault == "duplicated":
        assert report.repeated == tuple((row, 2, 1) for row in rows) and report.missing == ()
        shown = ", ".join(f"{row} (2 times, rule: 1)" for row in rows)
        assert f"0 rows missing, 10 repeated, 0 unexpected. repeated (first 20): {shown}." in str(
            error
        )
    else:
        assert report.missing == tuple(rows) and report.repeated == ()
        assert f"10 rows missing, 0 repeated, 0 unexpected. missing (first 20): {rows}." in str(
            error
        )
    assert str(error).startswith("coverage audit of epoch 0 FAILED: ")
    assert str(error).endswith(
        f"records: rank 1: {batches} batches, {batches * 10} rows (the rule gives it 50 batches)"
    )
    assert loaders[1].audit_report is report
    assert json.loads((tmp_path / "iteration1-report.json").read_text())["ok"] is False


@pytest.mark.timeout(60)
def test_the_sequential_mode_with_ranks_a_batch_apart(ids_1003, tmp_path):
    """shuffle=False (drop_last=False): 101 global batches over 3 ranks, 34, 34 and 33 each,
    nothing padded, every row once; the dataset's order is checked like any permutation."""
    loaders = [
        PrefetchLoader(
            ids_1003,
            10,
            columns=["id"],
            shuffle=False,
            rank=rank,
            world_size=3,
            audit=Audit(dir=tmp_path),
        )
        for rank in range(3)
    ]
    assert [read_to_end(loader) for loader in loaders] == [(34, None), (34, None), (33, None)]
    report = loaders[2].audit_report
    assert report.ok and (report.rows_expected, report.num_padded, report.num_dropped) == (
        1003,
        0,
        0,
    )
    assert [c.batches for c in report.shares] == [34, 34, 33]


def test_the_audit_dir_is_kept_absolute(ids_1003, monkeypatch, tmp_path):
    """As DiskCache's dir (``~``: ``test_options.py``): a relative folder is made absolute, so
    every process (and a later ``chdir``) writes its records to the same folder."""
    monkeypatch.chdir(tmp_path)
    audit = Audit(dir="relative")
    assert audit.dir == str(tmp_path / "relative")
    monkeypatch.chdir(tmp_path / "..")
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], rank=0, world_size=2, audit=audit)
    assert batch_ids(loader) == expected_rank_ids(loader)
    # rank 0's record, in the folder given, not one below the new working directory
    assert sorted(os.listdir(tmp_path / "relative")) == [
        "iteration1-rank0of2-worker0of1.npz",
        "rank0.iterations",
    ]
    assert not (tmp_path / ".." / "relative").exists()


@pytest.mark.timeout(60)
def test_misconfigurations_name_audit_dir_before_an_epoch_is_used(ids_1003, tmp_path):
    """Several ranks with no way to meet: the first next() raises, naming audit_dir, before the
    epoch is decided; bad audit options are refused at construction; an epoch not read to its
    end is not audited and leaves no record."""
    with pytest.raises(TypeError, match=r"^audit should be True, False or a lance_prefetch\.opt"):
        PrefetchLoader(ids_1003, 10, audit=1)
    with pytest.raises(TypeError, match=r"^Audit: dir should be a path"):
        Audit(dir=3)
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], rank=1, world_size=2, audit=True)
    message = (
        "audit=True on rank 1 of 2 needs the ranks' records to meet, but no torch.distributed "
        "process group is initialized; initialize the process group (with these ranks) before "
        "iterating, or pass audit=Audit(dir=...) with a folder every rank can write"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        next(iter(loader))
    assert loader.epoch == 0 and loader.state_dict()["epoch"] == 0  # no epoch used up
    with pytest.raises(
        ValueError,
        match=r"^audit=True in DataLoader workers needs a folder: each of the 2 workers",
    ):
        choose_exchange(None, Share(0, 1, 2), 1, in_worker=True)
    assert choose_exchange(None, Share(0, 0, 1), 1, in_worker=True) == "local"

    broken = PrefetchLoader(ids_1003, 10, columns=["id"], audit=Audit(dir=tmp_path))
    for step, _ in enumerate(broken):
        if step == 5:
            break
    broken.close()
    assert broken.audit_report is None and os.listdir(tmp_path) == ["rank0.iterations"]


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_dataloader_workers_through_audit_dir(ids_1003, tmp_path):
    """2 persistent workers, each its own process with its own record: epoch 0 passes (the last
    worker to finish checks, the report lands in audit_dir); in epoch 1 worker 1 hands its batch
    1 (the rank's batch 3) out twice, and the CoverageError reaches the training loop through
    the DataLoader, naming the rows and the worker."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], audit=Audit(dir=tmp_path))
    data = DataLoader(
        loader,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=WORKERS,
        persistent_workers=True,
        worker_init_fn=duplicate_in_worker_1,
    )
    loader.set_epoch(0)
    assert batch_ids(data) == expected_rank_ids(loader, epoch=0)
    assert sorted(os.listdir(tmp_path)) == ["iteration1-report.json", "rank0.iterations"]
    assert json.loads((tmp_path / "iteration1-report.json").read_text())["ok"] is True
    loader.set_epoch(1)
    rows = sorted(loader.epoch_plan(1).batch(3).indices.tolist())
    with stopping(data) as iterator, pytest.raises(CoverageError) as caught:
        for _ in iterator:
            pass
    text = str(caught.value)
    assert text.startswith("Caught CoverageError in DataLoader worker process ")
    shown = ", ".join(f"{row} (2 times, rule: 1)" for row in rows)
    assert (
        f"coverage audit of epoch 1 FAILED: {ids_1003!r} version 1, 2 records over 1 rank;" in text
    )
    assert f"0 rows missing, 10 repeated, 0 unexpected. repeated (first 20): {shown}." in text
    assert (
        "records: rank 0 worker 1 of 2: 51 batches, 510 rows (the rule gives it 50 batches)" in text
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_gloo_group_of_two_processes(ids_1003, tmp_path):
    """Two ranks of a real gloo process group, no audit_dir: the audit's own gloo group carries
    the records; every rank gets the verdict. A clean epoch passes on both; a batch duplicated
    on rank 1, or dropped on rank 0, fails on both ranks with its exact rows; ranks reading
    different epochs are refused; shuffle=False with rank 1 a batch short passes."""
    results = WORKERS.Queue()
    processes = [
        WORKERS.Process(target=gloo_rank, args=(rank, ids_1003, str(tmp_path / "store"), results))
        for rank in range(2)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = dict(results.get(timeout=100) for _ in processes)
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
    assert all(len(outcomes[rank]) == 5 for rank in (0, 1)), outcomes
    shuffled = PrefetchLoader(ids_1003, 10, drop_last=False, rank=0, world_size=2)
    for rank in (0, 1):
        clean, duplicated, dropped, mismatched, sequential = outcomes[rank]
        assert clean[:2] == ("ok", 51) and clean[2].ok and clean[2].rows_expected == 1004
        for (kind, batches, text, report), epoch in ((duplicated, 1), (dropped, 2)):
            faulty_rank, how, k = FAULTS[epoch]
            rows = sorted(shuffled.epoch_plan(epoch).batch(k * 2 + faulty_rank).indices.tolist())
            assert kind == "error" and text == report.failure() and not report.ok
            assert text.startswith(f"coverage audit of epoch {epoch} FAILED: ")
            if how == "duplicated":
                assert report.repeated == tuple((row, 2, 1) for row in rows)
                assert (report.num_repeated, report.num_missing) == (10, 0)
            else:
                assert report.missing == tuple(rows) and (
                    report.num_missing,
                    report.num_repeated,
                ) == (10, 0)
            expected_batches = 52 if how == "duplicated" else 50
            assert f"records: rank {faulty_rank}: {expected_batches} batches" in text
            assert batches == (expected_batches if rank == faulty_rank else 51)
        other = 1 - rank
        assert mismatched[:2] == ("error", 51) and mismatched[2].endswith(
            f"FAILED: the records disagree on what was read (rank {rank} is the reference): "
            f"rank {other} read epoch={3 + other} (against {3 + rank})"
        )
        assert sequential[:2] == ("ok", 51 - rank) and sequential[2].ok
        assert [c.batches for c in sequential[2].shares] == [51, 50]
