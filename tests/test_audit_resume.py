"""The coverage audit across a resume and across mismatched ranks (issue 28, item 4): a state of
an audited loader carries the record of the batches consumed before it (``state["audit"]``), so
the resumed epoch is checked whole and a batch lost or replayed at the resume is named by its
ids; records in ``audit_dir`` meet whatever they read, so ranks that read different seeds,
filters or epochs fail on every rank."""

from __future__ import annotations

import json
import os
import re

import pytest
from support.audit_runs import read_to_end

from lance_prefetch import Audit, CoverageError, PrefetchLoader
from lance_prefetch.loader._facade import loader_identity
from lance_prefetch.state import check_state


def _stopped_at(make, position: int, ranks: tuple[int, ...] = (0,)) -> dict:
    """The state of audited loaders (one per rank), each saved during epoch 0 after its
    ``position / len(ranks)``-th batch (the same on every rank); then each stops."""
    states = []
    for rank in ranks:
        loader = make(rank)
        with iter(loader) as iterator:
            for _ in range(position // len(ranks)):
                next(iterator)
            states.append(loader.state_dict())
    assert all(state == states[0] for state in states)
    return states[0]


def _rows(plan, position: int) -> list[int]:
    return sorted(plan.batch(position).indices.tolist())


@pytest.mark.timeout(60)
def test_a_clean_resume_is_audited_over_the_whole_epoch(ids_1003):
    """30 batches, a checkpoint, 10 more, a second checkpoint, the rest: each state records the
    batches consumed before it ([[0, 30]], then [[0, 40]]), and the resumed epoch's report covers
    all 100 batches (1,000 rows delivered, as the rule says, 3 dropped). A state without the
    record resumes with an audit of the rest of the epoch only, and says so; the state it saves
    then has no record (unknown), while a new epoch's state records nothing consumed."""

    def make(rank=0):
        return PrefetchLoader(ids_1003, 10, columns=["id"], seed=3, audit=True)

    state = _stopped_at(make, 30)
    assert state["audit"] == [[0, 30]] and state["position"] == 30
    middle = make()
    middle.load_state_dict(state)
    assert middle.state_dict()["audit"] == [[0, 30]]  # loaded, not yet read: kept
    with iter(middle) as iterator:
        for _ in range(10):
            next(iterator)
        state = middle.state_dict()
    assert (state["position"], state["audit"]) == (40, [[0, 40]])
    last = make()
    last.load_state_dict(state)
    assert read_to_end(last) == (60, None)
    report = last.audit_report
    assert report.ok and (report.start, report.before) == (40, ((0, 40),))
    assert (report.rows_expected, report.rows_delivered, report.num_dropped) == (1000, 1000, 3)
    assert " from global batch 40, the whole epoch (the checkpoint's record of the batches " in (
        report.summary()
    )
    assert last.state_dict()["audit"] == [[0, 100]]  # the finished epoch: every batch

    unknown = make()
    unknown.load_state_dict({k: v for k, v in state.items() if k != "audit"})
    assert "audit" not in unknown.state_dict()
    assert read_to_end(unknown) == (60, None)
    report = unknown.audit_report
    assert report.ok and report.before is None and report.rows_expected == 600
    assert "from global batch 40 (the rest of the epoch only: the resumed state had no audit " in (
        report.summary()
    )
    assert "audit" not in unknown.state_dict()
    unknown.set_epoch(1)
    assert unknown.state_dict()["audit"] == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shift", [1, -1])
def test_a_batch_lost_or_replayed_at_a_resume_is_named(shift, ids_1003):
    """The state's position moved by one after the checkpoint (a resume bug): +1 skips global
    batch 30, whose 10 rows the resumed epoch's last next() names as missing; -1 replays batch
    29, whose rows it names as repeated (2 times, rule: 1)."""

    def make(rank=0):
        return PrefetchLoader(ids_1003, 10, columns=["id"], seed=5, audit=True)

    state = _stopped_at(make, 30)
    resumed = make()
    resumed.load_state_dict(state | {"position": 30 + shift})
    batches, error = read_to_end(resumed)
    assert batches == 70 - shift and isinstance(error, CoverageError)
    report, plan = error.report, resumed.epoch_plan(0)
    assert report.before == ((0, 30),) and report.start == 30 + shift
    if shift == 1:
        rows = _rows(plan, 30)
        assert (report.missing, report.num_missing, report.repeated) == (tuple(rows), 10, ())
        assert f"10 rows missing, 0 repeated, 0 unexpected. missing (first 20): {rows}." in str(
            error
        )
    else:
        rows = _rows(plan, 29)
        assert report.repeated == tuple((row, 2, 1) for row in rows)
        assert (report.num_repeated, report.missing, report.num_unexpected) == (10, (), 0)
        shown = ", ".join(f"{row} (2 times, rule: 1)" for row in rows)
        assert f"repeated (first 20): {shown}." in str(error)
    # the record goes on from the loaded one: [0, 30) and the batches read since
    assert resumed.state_dict()["audit"] == ([[0, 30], [31, 100]] if shift == 1 else [[0, 100]])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shift", [1, -1])
def test_two_ranks_resumed_through_audit_dir_name_a_lost_or_replayed_batch(
    shift, ids_1003, tmp_path
):
    """2 ranks through audit_dir stop after 10 batches each (global position 20; the state, the
    same on both, records [[0, 20]]); resumed at 21 (batch 20 lost) or 19 (batch 19 replayed).
    The rank that checks raises CoverageError with those ids; the other rank raises the same
    failure at its next iteration's start, once."""

    def make(rank):
        return PrefetchLoader(
            ids_1003, 10, columns=["id"], rank=rank, world_size=2, audit=Audit(dir=tmp_path)
        )

    state = _stopped_at(make, 20, ranks=(0, 1))
    assert state["audit"] == [[0, 20]]
    resumed = [make(rank) for rank in (0, 1)]
    for loader in resumed:
        loader.load_state_dict(state | {"position": 20 + shift})
    each = 39 if shift == 1 else 40  # global batches 21..98, or 19..98
    assert read_to_end(resumed[0]) == (each, None)  # its record is in, not checked yet
    batches, error = read_to_end(resumed[1])
    assert batches == each and isinstance(error, CoverageError)
    plan = resumed[1].epoch_plan(0)
    if shift == 1:
        rows = _rows(plan, 20)
        assert error.report.missing == tuple(rows) and error.report.num_missing == 10
        detail = f"10 rows missing, 0 repeated, 0 unexpected. missing (first 20): {rows}."
    else:
        rows = _rows(plan, 19)
        assert error.report.repeated == tuple((row, 2, 1) for row in rows)
        shown = ", ".join(f"{row} (2 times, rule: 1)" for row in rows)
        detail = f"0 rows missing, 10 repeated, 0 unexpected. repeated (first 20): {shown}."
    assert detail in str(error)
    assert json.loads((tmp_path / "iteration2-report.json").read_text())["ok"] is False
    with pytest.raises(CoverageError) as told:
        next(iter(resumed[0]))
    assert str(told.value) == (
        f"coverage audit of this rank's iteration 2 over the audit's folder, checked by rank 1: {error}"
    )
    assert sorted(os.listdir(tmp_path)) == [
        "iteration2-report.json",
        "rank0.iterations",
        "rank1.iterations",
    ]
    assert resumed[0].epoch == 0  # raised before an epoch was decided; told once:
    resumed[0].set_epoch(1)
    assert next(iter(resumed[0]))["id"].shape == (10,)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("options", "difference"),
    [
        ([{"seed": 0}, {"seed": 1}], "seed=0 (against 1)"),
        (
            [{"filter": "id < 80"}, {"filter": "id >= 20"}],
            "filter='id < 80' (against 'id >= 20'), num_rows=80 (against 983)",
        ),
        ([{"epoch": 0}, {"epoch": 1}], "epoch=0 (against 1)"),
    ],
    ids=["seed", "filter", "epoch"],
)
def test_ranks_that_read_differently_fail_on_every_rank(options, difference, ids_1003, tmp_path):
    """Two ranks through one audit_dir that read with another seed, filter or epoch: their
    records meet all the same (named by the ranks' iteration numbers, not by what they read),
    the checking rank raises CoverageError naming the first difference, and the other rank
    raises it at its next iteration's start."""
    loaders = []
    for rank, option in enumerate(options):
        option = dict(option)
        epoch = option.pop("epoch", 0)
        loader = PrefetchLoader(
            ids_1003,
            10,
            columns=["id"],
            rank=rank,
            world_size=2,
            audit=Audit(dir=tmp_path),
            **option,
        )
        loader.set_epoch(epoch)
        loaders.append(loader)
    first, error = read_to_end(loaders[0])
    assert error is None and loaders[0].audit_report is None
    _, error = read_to_end(loaders[1])
    message = (
        f"coverage audit of epoch {loaders[1].epoch} of {ids_1003!r} version 1 FAILED: the "
        f"records disagree on what was read (rank 1 is the reference): rank 0 read {difference}"
    )
    assert isinstance(error, CoverageError) and str(error) == message
    saved = json.loads((tmp_path / "iteration1-report.json").read_text())
    assert saved == {"ok": False, "failure": message}
    told = f"coverage audit of this rank's iteration 1 over the audit's folder, checked by rank 1: {message}"
    with pytest.raises(CoverageError, match=f"^{re.escape(told)}$"):
        next(iter(loaders[0]))


def test_check_state_refuses_a_malformed_audit_record(ids_1003):
    """state["audit"]: [start, stop) pairs of ints, ascending, not overlapping, within the
    epoch's end (100 batches of 10 rows from 1,003 with drop_last=True)."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], audit=True)
    state = loader.state_dict()
    assert state["audit"] == []
    identity = loader_identity(loader)
    assert check_state(state | {"audit": [[0, 4], [6, 100]]}, identity)["audit"] == [
        [0, 4],
        [6, 100],
    ]
    for record in ("0-30", [[0, True]], [[0, 1, 2]], [(0.0, 3)]):
        with pytest.raises(TypeError, match=r"^state\['audit'\] should be a list of \[start, "):
            check_state(state | {"audit": record}, identity)
    for record in ([[3, 3]], [[0, 5], [4, 8]], [[5, 8], [0, 2]], [[-1, 2]], [[0, 101]]):
        message = (
            f"state['audit'] should hold [start, stop) intervals of global batches with 0 <= "
            f"start < stop <= 100 (the epoch's end), ascending and not overlapping, but got "
            f"{record!r}; pass the state as state_dict() returned it, or drop state['audit'] "
            f"to audit the rest of the epoch only"
        )
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            check_state(state | {"audit": record}, identity)
    loader.load_state_dict(state | {"audit": [[0, 7]], "position": 7})
    assert loader.state_dict()["audit"] == [[0, 7]]
