"""pin_memory and device: the options' checks, and batches handed out one copy ahead.

This machine's torch has no accelerator: the pinning and the side-stream copy are exercised
through the same code with ``device="meta"`` (a device without streams) and fakes of torch's
checks; a GPU run is what proves the overlap itself.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from support.helpers import WORKERS
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader
from lance_prefetch.convert._device import DeviceFeed, Placement, check_placement, to_device


def test_options_are_checked_before_any_io():
    with pytest.raises(TypeError, match="pin_memory should be a bool"):
        PrefetchLoader("/nowhere.lance", 4, pin_memory="yes")
    with pytest.raises(TypeError, match="device should be a str"):
        PrefetchLoader("/nowhere.lance", 4, device=1.5)
    with pytest.raises(ValueError, match="device='gpu' is not a device torch knows"):
        PrefetchLoader("/nowhere.lance", 4, device="gpu")


def test_a_device_whose_backend_is_missing_is_refused(monkeypatch):
    accelerator = torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda:1': torch.cuda.is_available\(\) is False"):
        check_placement(False, "cuda:1")
    if not accelerator:  # an index names an accelerator
        with pytest.raises(ValueError, match="device=0 is an accelerator index, but torch finds"):
            check_placement(False, 0)


def test_pin_memory_without_an_accelerator_warns_where_the_loader_is_built(ids_25, monkeypatch):
    monkeypatch.setattr("lance_prefetch.convert._device._accelerator_available", lambda: False)
    with pytest.warns(UserWarning, match="no accelerator is found") as caught:
        loader = PrefetchLoader(ids_25, 5, pin_memory=True)
    assert caught[0].filename == __file__
    assert loader.config.placement == Placement(pinned=False, device=None)


def test_pinning_runs_in_the_read_threads(ids_25, monkeypatch):
    """With an accelerator, each batch goes through torch's own pin_memory after the transform."""
    monkeypatch.setattr("lance_prefetch.convert._device._accelerator_available", lambda: True)
    pinned = []

    def fake_pin(batch):
        pinned.append(batch["id"].tolist())
        return {**batch, "pinned": True}

    monkeypatch.setattr("lance_prefetch.convert._device._pin", fake_pin)
    loader = PrefetchLoader(ids_25, 5, columns=["id"], transform=lambda b: {"id": b["id"] * 2})
    expected = [[2 * i for i in b.indices.tolist()] for b in loader.epoch_plan(0).rank_batches(0)]
    loader = PrefetchLoader(
        ids_25, 5, columns=["id"], pin_memory=True, transform=lambda b: {"id": b["id"] * 2}
    )
    batches = list(loader)
    assert [b["id"].tolist() for b in batches] == expected
    assert all(b["pinned"] for b in batches) and sorted(pinned) == sorted(expected)


def test_device_cpu_hands_out_the_batches_as_read(ids_25):
    loader = PrefetchLoader(ids_25, 5, columns=["id"], device="cpu")
    assert loader.config.placement == Placement()
    plan = loader.epoch_plan(0)
    assert [b["id"].tolist() for b in loader] == [b.indices.tolist() for b in plan.rank_batches(0)]


def test_batches_reach_the_device_and_the_state_counts_what_was_handed_out(ids_1003):
    """device="meta" (no streams): every batch on the device with its shape and dtype; the copy
    of the next batch is issued before a batch is handed out, but the state counts only the
    batches the loop received, so a resume reads the rest exactly."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], device="meta", seed=3)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(7)]
    assert all(b["id"].device.type == "meta" and b["id"].shape == (10,) for b in first)
    assert first[0]["id"].dtype == torch.int64
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (0, 7)
    iterator.close()
    host = PrefetchLoader(ids_1003, 10, columns=["id"], seed=3)
    host.load_state_dict(state)
    rest = [b["id"].tolist() for b in host]
    assert rest == [b.indices.tolist() for b in host.epoch_plan(0).rank_batches(0)][7:]
    assert len(list(PrefetchLoader(ids_1003, 10, columns=["id"], device="meta"))) == 100


def test_device_is_refused_in_dataloader_workers(ids_25):
    loader = PrefetchLoader(ids_25, 5, device="meta")
    data = DataLoader(loader, batch_size=None, num_workers=1, multiprocessing_context=WORKERS)
    with pytest.raises(ValueError, match=r"pin_memory=True\) and move batches"):
        list(data)


class Takes:
    """A take() over ``batches`` that raises ``errors[i]`` at call ``i`` and logs each call."""

    def __init__(self, batches, errors=None):
        self.batches, self.errors, self.log = list(batches), dict(errors or {}), []

    def __call__(self):
        call = len([e for e in self.log if e[0] == "take"])
        self.log.append(("take", call))
        if call in self.errors:
            raise self.errors.pop(call)
        if not self.batches:
            raise StopIteration
        return {"x": torch.tensor(self.batches.pop(0))}


def feed(takes):
    return DeviceFeed(torch.device("meta"), takes, lambda: takes.log.append(("delivered",)))


def test_the_copy_of_the_next_batch_is_issued_before_a_batch_is_handed_out():
    takes = Takes([[0], [1], [2]])
    f = feed(takes)
    shapes = [f.next()["x"].shape for _ in range(3)]
    assert shapes == [(1,)] * 3
    assert takes.log == [
        ("take", 0),
        ("take", 1),
        ("delivered",),
        ("take", 2),
        ("delivered",),
        ("take", 3),
        ("delivered",),
    ]
    with pytest.raises(StopIteration):
        f.next()
    with pytest.raises(StopIteration):
        f.next()


def test_an_error_for_the_next_batch_comes_after_the_batch_before_it():
    takes = Takes([[0], [1]], errors={1: OSError("take failed")})
    f = feed(takes)
    assert f.next()["x"].shape == (1,)
    with pytest.raises(OSError, match="take failed"):
        f.next()
    with pytest.raises(StopIteration):
        f.next()


def test_an_interrupt_while_staging_keeps_the_batch_for_the_next_call():
    takes = Takes([[0, 0], [1]], errors={1: KeyboardInterrupt()})
    f = feed(takes)
    with pytest.raises(KeyboardInterrupt):
        f.next()
    assert ("delivered",) not in takes.log  # not counted: a resume reads it again
    assert f.next()["x"].shape == (2,)  # the batch held back
    assert f.next()["x"].shape == (1,)
    with pytest.raises(StopIteration):
        f.next()


def test_to_device_keeps_the_structure():
    batch = {"a": torch.zeros(2), "b": [torch.ones(1), "text"], "c": (torch.ones(3), 4)}
    moved = to_device(batch, torch.device("meta"))
    assert moved["a"].device.type == "meta" and moved["b"][0].device.type == "meta"
    assert moved["b"][1] == "text" and moved["c"][1] == 4 and isinstance(moved["c"], tuple)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_placement(False, None) == Placement()


class FakeStreams:
    """A stream backend that logs the order of copies and waits (as torch.cuda's API)."""

    def __init__(self, log):
        self.log = log
        backend = self

        class Stream:
            def __init__(self, device):
                self.name = "side"

            def wait_stream(self, other):
                backend.log.append(("wait", other.name))

        self.Stream = Stream
        self._current = Stream(None)
        self._current.name = "current"

    def current_stream(self, device):
        return self._current

    def stream(self, stream):
        log = self.log

        class Context:
            def __enter__(self):
                log.append(("copy on", stream.name))

            def __exit__(self, *exc):
                return False

        return Context()


def test_the_step_waits_for_its_own_copy_only(monkeypatch):
    """Batch k's copy is joined to the current stream before the copy of batch k + 1 is queued on
    the side stream, so that copy overlaps step k."""
    takes = Takes([[0], [1], [2]])
    log = takes.log
    monkeypatch.setattr(torch, "meta", FakeStreams(log), raising=False)
    monkeypatch.setattr("lance_prefetch.convert._device._record", lambda batch, stream: None)
    f = feed(takes)
    for _ in range(3):
        f.next()
    assert log == [
        ("take", 0),
        ("copy on", "side"),  # batch 0 issued at the first call
        ("wait", "side"),
        ("take", 1),
        ("copy on", "side"),
        ("delivered",),  # hand out 0
        ("wait", "side"),
        ("take", 2),
        ("copy on", "side"),
        ("delivered",),  # hand out 1
        ("wait", "side"),
        ("take", 3),
        ("delivered",),  # hand out 2; take 3: the end
    ]


def test_a_failed_copy_ends_the_iteration_after_the_batch_before_it(ids_1003, monkeypatch):
    """The copy of batch 3 fails: batches 0..2 are handed out, then the error; nothing after it,
    and the state says 3, so a resume reads batch 3 again."""
    real = to_device
    calls = []

    def flaky(batch, device):
        calls.append(isinstance(batch, dict))  # a batch, not one of its tensors
        if sum(calls) == 4 and calls[-1]:
            raise RuntimeError("copy failed")
        return real(batch, device)

    monkeypatch.setattr("lance_prefetch.convert._device.to_device", flaky)
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], device="meta")
    iterator = iter(loader)
    assert [next(iterator)["id"].device.type for _ in range(3)] == ["meta"] * 3
    assert loader.state_dict()["position"] == 3
    with pytest.raises(RuntimeError, match="copy failed"):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)
    assert loader.stats().batches == 3


def test_stats_count_the_batches_handed_out(ids_1003):
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], device="meta")
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    assert loader.stats().batches == 5 == loader.state_dict()["position"]
    iterator.close()
