"""Checkpoint state: the plain dict that :meth:`PrefetchLoader.state_dict` returns, and its checks.

Pure code: no Lance, no I/O. A state is JSON-serializable and a few hundred bytes::

    {"format_version": 5, "uri": "s3://bucket/train.lance", "version": 7, "num_rows": 1003,
     "seed": 0, "batch_size": 10, "drop_last": True, "world_size": 2, "epoch": 1, "position": 34,
     "permutation": "array", "filter": None, "split": None, "datasets": None, "weights": None}

``position`` counts the global batches of ``epoch`` (over all ranks) delivered to the training loop
before the next one; see :mod:`lance_prefetch.plan.sampling` for how a plan resumes from it, also with
another ``world_size``.

``permutation`` is the kind of the epoch's order (:mod:`lance_prefetch.plan.permutation`):
``"array"``, ``"lazy"``, or ``"identity"`` for ``shuffle=False``. ``filter`` (the predicate) and
``split`` (the :meth:`~lance_prefetch.plan.splits.Split.to_state` dict) say which rows a loader reads
(``None``: every row); its ``num_rows`` and ``position`` count the selected rows. ``datasets``
lists each dataset of a list ``source`` as ``{"uri", "version", "num_rows"}``, in order
(``"uri"`` and ``"version"`` are then the first one's), and ``weights`` a mixture's normalised
proportions (``None`` for a concatenation); both are ``None`` for one dataset. A state loads only
into a loader with the same values of :data:`MATCHED` (``allow_version_change`` lets versions
differ); the refusal names each that differs (for several datasets, the first dataset that
differs).

Formats 1 to 4 were saved by lance-prefetch versions before the seed rule of
:mod:`lance_prefetch.plan.sampling` ("Seeds"), whose permutations differ from this version's: such a
state is refused (``ValueError``) rather than resumed in another order, which would deliver some
rows twice and others never. Start that epoch afresh: call ``loader.set_epoch(state["epoch"])``
instead of ``load_state_dict``.

A state saved inside a DataLoader worker process (torchdata's ``StatefulDataLoader`` asks each
worker for its dataset's state) also has ``"worker": {"id": w, "num_workers": K, "start": S}``: it
describes that worker's share only (its ``position`` is after the last batch *it* delivered, of an
iteration that started at ``S``). ``StatefulDataLoader`` hands each worker back its own state; to
resume with other ``num_workers`` or ``world_size``, merge them with :func:`state_from_dataloader`.

A loader with ``audit=True`` also saves ``"audit"``, the coverage audit's record of the epoch's
global batches consumed before ``position``, as ``[start, stop)`` intervals, ascending and not
overlapping, within the epoch's end (:func:`~lance_prefetch.plan._positions.end_position`)::

    "audit": [[0, 34]]

One interval (16 bytes as two 64-bit integers; about ten characters of JSON) unless the epoch
was resumed from a state without one, and never more than one per resume. It is the union of
the loaded state's record and ``[start, position)`` of the iteration that read since, so a
resumed iteration's audit counts those batches' rows as delivered and checks the whole epoch
(:mod:`lance_prefetch.audit._wiring`): a batch lost or replayed at a resume is named. Like the rest of
the state it describes global positions, the same on every rank. The key is optional: without
it (``audit=False`` when saved, or a version before it, which also ignores it) the audit of a
resumed epoch covers the rows from ``position`` on, and its report says so. A DataLoader
worker's state records the batches before its own position, as its ``position`` does.

A worker's share read through a wrapper that pulls a batch ahead of the training step, where
that batch is counted in the workers' states (Ray Train's ``prepare_data_loader`` wrapper:
``StatefulDataLoader`` snapshots the workers' states as it hands each batch out, so a state
saved between steps counts the batch the wrapper holds), also has ``"read_ahead": <the wrapper,
in words>``. Such a share never loads (it would resume one batch late), and
:func:`state_from_dataloader` refuses it but at the iteration's end, where the wrapper holds
nothing; the refusal names the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from lance_prefetch.plan._positions import end_position, merge_worker_states

__all__ = [
    "FORMAT_VERSION",
    "check_state",
    "make_state",
    "state_from_dataloader",
]

#: The state layout, stored as ``"format_version"``; 1 to 4 are refused (see above).
FORMAT_VERSION = 5
_EARLIER = (1, 2, 3, 4)  # formats saved with the permutations of SeedSequence([seed, epoch])
_PART_OF = ("filter", "split")
_FIELDS = ("permutation", *_PART_OF, "datasets", "weights")  # beyond _TYPES, each may be None

_TYPES: dict[str, type | tuple[type, ...]] = {
    "format_version": int,
    "uri": str,
    "version": int,
    "num_rows": int,
    "seed": int,
    "batch_size": int,
    "drop_last": bool,
    "world_size": int,
    "epoch": int,
    "position": int,
}
# optional: "audit" (a list of [start, stop] pairs), checked by _check_audit
#: Fields that must equal the loader's own for a state to load (``version`` can be allowed to differ).
MATCHED = (
    "uri",
    "version",
    "datasets",
    "weights",
    "filter",
    "split",
    "num_rows",
    "seed",
    "batch_size",
    "drop_last",
    "permutation",
)
_PERMUTATIONS = ("array", "lazy", "identity")


def make_state(
    *,
    uri: str,
    version: int,
    num_rows: int,
    seed: int,
    batch_size: int,
    drop_last: bool,
    world_size: int,
    epoch: int,
    position: int,
    worker: Mapping[str, int] | None = None,
    read_ahead: str | None = None,
    permutation: str = "array",
    filter: str | None = None,
    split: Mapping[str, Any] | None = None,
    datasets: list[Mapping[str, Any]] | None = None,
    weights: list[float] | None = None,
) -> dict[str, Any]:
    """A state dict in the layout above (``worker`` only for a DataLoader worker's share, and
    ``read_ahead`` only with it: the wrapper whose held batch the share counts)."""
    state: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "uri": uri,
        "version": version,
        "num_rows": num_rows,
        "seed": seed,
        "batch_size": batch_size,
        "drop_last": drop_last,
        "world_size": world_size,
        "epoch": epoch,
        "position": position,
        "permutation": permutation,
        "filter": filter,
        "split": None if split is None else dict(split),
        "datasets": None if datasets is None else [dict(d) for d in datasets],
        "weights": None if weights is None else list(weights),
        **({} if worker is None else {"worker": dict(worker)}),
    }
    if worker is not None and read_ahead is not None:
        state["read_ahead"] = read_ahead
    return state


def check_state(
    state: Any, expected: Mapping[str, Any], *, allow_version_change: bool = False
) -> dict[str, Any]:
    """Check that ``state`` is well formed and belongs to a loader described by ``expected``.

    Args:
        state: what the user passed to ``load_state_dict``.
        expected: the loader's own values of :data:`MATCHED`.
        allow_version_change (bool, optional): accept another dataset ``version``. Default: ``False``.

    Returns:
        ``state`` itself (now known to be valid).

    Raises:
        TypeError: ``state`` is not a mapping, or a field has the wrong type.
        ValueError: a field is missing or out of range, the layout version is unknown or
            earlier than :data:`FORMAT_VERSION` (another version's permutations), or the state
            belongs to another dataset, version, filter, split, seed, batch size, ``drop_last``
            or permutation kind (the message names each mismatch with both values).
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            f"state should be a dict returned by PrefetchLoader.state_dict(), but got "
            f"{type(state).__name__}"
        )
    missing = [key for key in _TYPES if key not in state]
    if missing:
        raise ValueError(
            f"state is missing {', '.join(missing)}; pass a dict returned by "
            f"PrefetchLoader.state_dict() (a torchdata StatefulDataLoader's own state_dict goes "
            f"to StatefulDataLoader.load_state_dict, or through state_from_dataloader())"
        )
    for key, kind in _TYPES.items():
        value = state[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise TypeError(f"state[{key!r}] should be {names}, but got {value!r}")
    if state["format_version"] in _EARLIER:
        raise ValueError(
            f"state['format_version'] is {state['format_version']}: the state was saved by an "
            f"earlier lance-prefetch, whose permutations differ from this version's (the seed "
            f"rule of lance_prefetch.plan.sampling), so it cannot resume in the same order; start the "
            f"epoch afresh: call loader.set_epoch({state['epoch']}) instead of load_state_dict"
        )
    if state["format_version"] != FORMAT_VERSION:
        raise ValueError(
            f"state['format_version'] is {state['format_version']}, but this version of "
            f"lance-prefetch reads format {FORMAT_VERSION} (a state saved by a later version "
            f"needs that version)"
        )
    for key in _FIELDS:
        if key not in state:
            raise ValueError(
                f"state['format_version'] is {FORMAT_VERSION}, but state[{key!r}] is missing"
            )
    if state["filter"] is not None and not isinstance(state["filter"], str):
        raise TypeError(f"state['filter'] should be str or None, but got {state['filter']!r}")
    if state["split"] is not None and not isinstance(state["split"], Mapping):
        raise TypeError(f"state['split'] should be a dict or None, but got {state['split']!r}")
    _check_datasets(state)
    if state["permutation"] not in _PERMUTATIONS:
        raise ValueError(
            f"state['permutation'] should be one of {', '.join(map(repr, _PERMUTATIONS))}, but "
            f"got {state['permutation']!r}"
        )
    matched = [k for k in MATCHED if not (k == "version" and allow_version_change)]
    several = state["datasets"] is not None and expected["datasets"] is not None
    mismatches = [
        k
        for k in matched
        if not (k in ("uri", "version") and several)  # compared in "datasets"
        and not (
            _same_uri(state[k], expected[k])
            if k == "uri"
            else _same(k, state, expected, allow_version_change)
        )
    ]
    if mismatches:
        details = "; ".join(
            _dataset_difference(state[k], expected[k])
            if k == "datasets" and several
            else f"{k} is {state[k]!r} in the state but {expected[k]!r} in this loader"
            for k in mismatches
        )
        hint = (
            " (or pass allow_version_change=True to continue on another version)"
            if mismatches == ["version"]
            else f" (PrefetchLoader(..., shuffle={_shuffle_of(state['permutation'])}))"
            if mismatches == ["permutation"]
            else " (the same filter and split: the state's positions count their rows)"
            if set(mismatches) & set(_PART_OF)
            else ""
        )
        raise ValueError(
            f"state does not match this loader: {details}. Build the loader with the state's "
            f"values to resume{hint}, or start without load_state_dict"
        )
    for key in ("epoch", "position"):
        if state[key] < 0:
            raise ValueError(f"state[{key!r}] should be >= 0, but got {state[key]}")
    if state["epoch"] > 2**62:  # set_epoch's bound: the epoch state is signed 64-bit
        raise ValueError(f"state['epoch'] should be <= 2**62, but got {state['epoch']}")
    if state["world_size"] < 1:
        raise ValueError(f"state['world_size'] should be >= 1, but got {state['world_size']}")
    limit = end_position(state["num_rows"], state["batch_size"], drop_last=state["drop_last"])
    if "worker" in state:  # a worker's share may end inside a padded last round
        limit += state["world_size"]
    if state["position"] > limit:
        raise ValueError(
            f"state['position']={state['position']} is past the end of any epoch of "
            f"{state['num_rows']} rows in batches of {state['batch_size']} with "
            f"drop_last={state['drop_last']} (at most {limit} global batches)"
        )
    if "worker" in state:
        _check_worker(state)
    if "audit" in state:
        _check_audit(
            state["audit"],
            end_position(state["num_rows"], state["batch_size"], drop_last=state["drop_last"]),
        )
    return dict(state)


def state_from_dataloader(dataloader_state: Mapping[str, Any]) -> dict[str, Any]:
    """The loader's state inside a torchdata ``StatefulDataLoader.state_dict()``, as one global state.

    With ``num_workers=0`` that is the loader's own state; with workers, each worker's share is
    merged: the DataLoader hands out its workers' batches round-robin, so the batches delivered to
    the training loop are exactly those before the furthest worker's position. The result loads into
    a :class:`~lance_prefetch.PrefetchLoader` used with any ``num_workers`` and ``world_size``.

    Raises:
        ValueError: no loader state is in it, the workers' states disagree, the DataLoader took
            its last snapshot some steps ago (use ``snapshot_every_n_steps=1``, its default), or
            it was iterated through Ray Train's ``prepare_data_loader`` wrapper and saved before
            the iteration's end (its workers' states count the batch the wrapper holds).
    """
    if not isinstance(dataloader_state, Mapping):
        raise TypeError(
            f"dataloader_state should be StatefulDataLoader.state_dict(), but got "
            f"{type(dataloader_state).__name__}"
        )
    if "_snapshot" not in dataloader_state:  # num_workers=0
        state = dataloader_state.get("dataset_state")
        if not isinstance(state, Mapping):
            raise ValueError(
                "dataloader_state holds no PrefetchLoader state; pass the state_dict() of a "
                "StatefulDataLoader that iterates a PrefetchLoader"
            )
        return dict(state)
    if dataloader_state.get("_steps_since_snapshot", 0):
        raise ValueError(
            f"the StatefulDataLoader's last snapshot is {dataloader_state['_steps_since_snapshot']} "
            f"steps old, so its worker states lag the batches delivered; create it with "
            f"snapshot_every_n_steps=1 (the default)"
        )
    workers = dataloader_state["_snapshot"].get("_worker_snapshots", {})
    states = [w.get("dataset_state") for w in workers.values()]
    if not states or not all(isinstance(s, Mapping) and "worker" in s for s in states):
        raise ValueError(
            "dataloader_state holds no PrefetchLoader worker states; pass the state_dict() of a "
            "StatefulDataLoader that iterates a PrefetchLoader"
        )
    ahead = next((s["read_ahead"] for s in states if "read_ahead" in s), None)
    if ahead is not None and not dataloader_state.get("_iterator_finished", False):
        raise ValueError(_read_ahead_refusal(ahead))
    return merge_worker_states(states)


def _read_ahead_refusal(wrapper: str) -> str:
    """Why a DataLoader workers' state read through ``wrapper`` is refused, and the fix."""
    return (
        f"the DataLoader workers' states count the batch {wrapper} holds ahead of the training "
        f"step (it started them), so they would resume one batch late; use "
        f"ray.train.torch.prepare_data_loader(..., move_to_device=False) and move each batch to "
        f"the device in the step, or save loader.state_after(steps) with the loop's own count of "
        f"this epoch's steps"
    )


def _same_uri(saved: str, current: str) -> bool:
    """Whether two URIs name the same dataset: local paths compare resolved (``./x.lance``,
    ``x.lance``, ``file:///abs/x.lance`` and the absolute path are one), others as written."""

    def local(uri: str) -> str | None:
        if uri.startswith("file://"):
            return os.path.realpath(uri[len("file://") :])
        return None if "://" in uri else os.path.realpath(uri)

    if saved == current:
        return True
    return local(saved) is not None and local(saved) == local(current)


def _same(
    key: str, saved: Mapping[str, Any], expected: Mapping[str, Any], any_version: bool
) -> bool:
    if key != "datasets" or saved[key] is None or expected[key] is None:
        return bool(saved[key] == expected[key])
    return _dataset_difference(saved[key], expected[key], any_version=any_version) == ""


def _dataset_difference(saved: list[Any], current: list[Any], *, any_version: bool = False) -> str:
    """The first dataset that differs between two ``"datasets"`` lists, in words (``""``: none)."""
    if len(saved) != len(current):
        return (
            f"the state reads {len(saved)} datasets ({', '.join(d['uri'] for d in saved)}) but "
            f"this loader {len(current)} ({', '.join(d['uri'] for d in current)})"
        )
    for i, (old, new) in enumerate(zip(saved, current, strict=True)):
        same_version = any_version or old["version"] == new["version"]
        if not _same_uri(old["uri"], new["uri"]) or not same_version:
            return (
                f"datasets[{i}] is {old['uri']!r} version {old['version']} in the state but "
                f"{new['uri']!r} version {new['version']} in this loader"
            )
        if old["num_rows"] != new["num_rows"]:
            return (
                f"datasets[{i}] ({new['uri']!r}) has {old['num_rows']} rows in the state but "
                f"{new['num_rows']} in this loader"
            )
    return ""


def _check_datasets(state: Mapping[str, Any]) -> None:
    datasets, weights = state.get("datasets"), state.get("weights")
    if datasets is not None and not (
        isinstance(datasets, list)
        and all(
            isinstance(d, Mapping) and set(d) == {"uri", "version", "num_rows"} for d in datasets
        )
    ):
        raise TypeError(
            f"state['datasets'] should be a list of {{'uri', 'version', 'num_rows'}} dicts or "
            f"None, but got {datasets!r}"
        )
    if weights is not None and not (
        isinstance(weights, list) and all(isinstance(w, (int, float)) for w in weights)
    ):
        raise TypeError(
            f"state['weights'] should be a list of numbers or None, but got {weights!r}"
        )


def _check_worker(state: Mapping[str, Any]) -> None:
    if state.get("read_ahead") is not None:
        raise ValueError(_read_ahead_refusal(state["read_ahead"]))
    worker = state["worker"]
    if not isinstance(worker, Mapping) or set(worker) != {"id", "num_workers", "start"}:
        raise ValueError(
            f"state['worker'] should be {{'id', 'num_workers', 'start'}}, but got {worker!r}"
        )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in worker.values()):
        raise TypeError(f"state['worker'] should hold integers, but got {worker!r}")
    if not (0 <= worker["id"] < worker["num_workers"]) or not 0 <= worker["start"]:
        raise ValueError(f"state['worker'] is out of range: {worker!r}")
    done = state["position"] - worker["start"]
    if done < 0 or done % state["world_size"]:
        raise ValueError(
            f"state['position']={state['position']} does not follow whole rounds of "
            f"world_size={state['world_size']} from the worker's start {worker['start']}"
        )


def _check_audit(record: Any, end: int) -> None:
    """``state["audit"]``: ``[start, stop)`` pairs of ints, ascending, not overlapping, within
    ``[0, end]``."""
    pairs = isinstance(record, (list, tuple)) and all(
        isinstance(pair, (list, tuple))
        and len(pair) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        for pair in record
    )
    if not pairs:
        raise TypeError(
            f"state['audit'] should be a list of [start, stop] pairs of ints (the coverage "
            f"audit's record of the batches consumed before the checkpoint), but got {record!r}"
        )
    last = 0
    for low, high in record:
        if not last <= low < high <= end:
            raise ValueError(
                f"state['audit'] should hold [start, stop) intervals of global batches with "
                f"0 <= start < stop <= {end} (the epoch's end), ascending and not overlapping, "
                f"but got {record!r}; pass the state as state_dict() returned it, or drop "
                f"state['audit'] to audit the rest of the epoch only"
            )
        last = high


def _shuffle_of(permutation: str) -> str:
    """The ``shuffle`` argument that reads with a state's ``permutation``."""
    if permutation == "identity":
        return "False"
    return f"Shuffle(permutation={permutation!r})"
