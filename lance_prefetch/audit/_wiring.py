"""The coverage audit's wiring (``PrefetchLoader(audit=True)`` or ``audit=Audit(dir=...)``):
:class:`EpochAudit` records every batch an iteration hands out and, at the epoch's end, brings
the records of every rank and DataLoader worker together and checks them
(:mod:`lance_prefetch.audit._coverage`).

How records meet (:func:`choose_exchange`, decided when an iteration begins):

1. An audit folder (``Audit(dir=...)``, ``audit_dir`` in the functions below) given: the folder.
   Records are named by what does not decide rows, so the records of one run meet whatever they
   read: ``iteration<n>-rank<r>of<W>-worker<w>of<K>.npz``, ``n`` numbering the iterations each rank
   began over this folder (the ledger ``rank<r>.iterations``, one line per iteration: the loader's
   token and the iteration's identity, which its DataLoader workers share), so every rank's ``n``-th
   iteration meets the others' ``n``-th. What decides the rows (dataset, version, seed, epoch,
   start, batch size, world size, filter, split, weights, ``num_rows``, permutation, shuffle,
   ``drop_last``, the resumed record) is inside each record, and the checker compares it first. Each
   process writes its record atomically (a temporary file, then ``os.replace``) when its share of
   the epoch is handed out. The first writer to find every expected record claims the check (a file
   created with ``O_EXCL``), checks, writes ``iteration<n>-report.json`` and removes the records.
   Nothing waits for another process, so nothing can hang. A failed check raises
   :class:`~lance_prefetch.CoverageError` in the process that checked and leaves
   ``iteration<n>-rank<r>.failed`` for each other rank: a process of that rank takes it (the first
   to rename it) at its next iteration's start or epoch's end and raises the same error.
2. A single record in all (one rank, or one reader of every rank, without DataLoader workers):
   checked where it is.
3. ``torch.distributed`` initialised with the loader's ranks (not in a DataLoader worker): over a
   gloo group of the audit's own (made at the first audited iteration, so the exchange never
   interleaves with the training's collectives, on CPU tensors whatever the training's backend).
   Rank 0 gathers the records one by one and checks; every rank gets the verdict and raises the
   same :class:`~lance_prefetch.CoverageError`. A collective: every rank must read the epoch to
   its end (with ``shuffle=False`` ranks may end a batch apart; the first waits there, at most
   :data:`EXCHANGE_TIMEOUT_S`).
4. Otherwise: ``ValueError`` naming ``Audit(dir=...)``.

A resumed epoch (from a state of ``state_dict()``) is audited over the whole epoch when the state
carries the audit's record (``state["audit"]``: the batches consumed before the checkpoint,
:mod:`lance_prefetch.state`): the checker counts their rows as delivered once (in no share's
record), so a batch lost or replayed at the resume is named. :class:`AuditMemory` keeps the
loaded record and stamps the saved one.

An epoch not read to its end (``break``, an error, ``close()``) is not audited and leaves no record.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lance_prefetch._errors import CoverageError
from lance_prefetch.audit._bitset import CoverageRecord, Delivered
from lance_prefetch.audit._coverage import (
    AuditReport,
    Share,
    Spans,
    add_span,
    check,
    clip_spans,
    complete,
    disagreement,
)
from lance_prefetch.plan._positions import Decision, end_position
from lance_prefetch.plan.sampling import EpochPlan
from lance_prefetch.sources._storage import redact_uri

__all__ = ["AuditMemory", "EXCHANGE_TIMEOUT_S", "EpochAudit", "choose_exchange", "open_audit"]

logger = logging.getLogger("lance_prefetch.audit")

#: Seconds a rank waits in the torch.distributed exchange for the others to reach the epoch's end.
EXCHANGE_TIMEOUT_S = 300.0

_RECORD = re.compile(r"^(iteration\d+)-rank(-?\d+)of(\d+)-worker(\d+)of(\d+)\.npz$")
_GROUP: list[Any] = []  # [default group, the audit's gloo group] once made in this process


def choose_exchange(
    audit_dir: str | os.PathLike[str] | None, share: Share, world_size: int, *, in_worker: bool
) -> str:
    """How the records of an audited iteration reading ``share`` of a ``world_size``-rank plan
    meet, by the module docstring's rules: ``"dir"`` (``audit_dir``, the audit's folder, given),
    ``"local"`` or ``"dist"``. Called before the iteration decides its epoch, so a
    misconfiguration uses none up.

    With ``audit_dir``, a failed check of an earlier iteration that another process ran is
    raised here, before anything is decided (see the module docstring).

    Raises:
        ValueError: more than one record and no way for them to meet (the message names
            ``Audit(dir=...)`` and the fix).
        CoverageError: with ``audit_dir``, an earlier iteration's check failed in another
            process (once per failure and rank).
    """
    if audit_dir is not None:
        _learn(Path(audit_dir), share.rank)
        return "dir"
    ranks = 1 if share.rank < 0 else world_size
    if ranks * share.num_workers == 1:
        return "local"
    if in_worker:
        raise ValueError(
            f"audit=True in DataLoader workers needs a folder: each of the {share.num_workers} "
            f"workers is a process of its own that hands out its own batches, so their records "
            f"meet in a folder; pass audit=Audit(dir=...) with a folder every rank and worker "
            f"can write (a shared file system across machines), or use num_workers=0"
        )
    live = (dist.get_rank(), dist.get_world_size()) if _initialised() else None
    if live != (share.rank, world_size):
        found = "no torch.distributed process group is initialized"
        if live is not None:
            found = f"the torch.distributed process group has rank {live[0]} of {live[1]}"
        raise ValueError(
            f"audit=True on rank {share.rank} of {world_size} needs the ranks' records to meet, "
            f"but {found}; initialize the process group (with these ranks) before iterating, "
            f"or pass audit=Audit(dir=...) with a folder every rank can write"
        )
    return "dist"


def open_audit(
    exchange: str | None,
    plan: EpochPlan,
    share: Share,
    audit_dir: str | os.PathLike[str] | None,
    *,
    identity: Mapping[str, Any],
    memory: AuditMemory | None = None,
    ident: int = 0,
) -> EpochAudit | None:
    """The audit of one iteration, exchanging as :func:`choose_exchange` said (``None``: no
    audit), over the whole epoch when ``memory`` holds the record of the loaded state the
    iteration resumes (``ident``: the iteration's identity, shared by its DataLoader workers).
    With ``"dist"``, makes the audit's gloo group first if this process has none yet (a
    collective: every rank does so as its first audited iteration begins). With ``"dir"``,
    numbers the iteration in ``audit_dir`` (the rank's ledger)."""
    if exchange is None:
        return None
    if exchange == "dist":
        _audit_group()
    memory = memory or AuditMemory()
    return EpochAudit(
        plan,
        share,
        exchange=exchange,
        audit_dir=audit_dir,
        identity=identity,
        before=memory.before(Decision(plan.epoch, plan.start)),
        key=f"{memory.token}-{ident}",
    )


class AuditMemory:
    """What a loader's audit keeps between its iterations (copied into DataLoader workers with
    the loader): ``token``, random, naming the loader's iterations in an ``audit_dir`` ledger;
    and the record of the state loaded last (``state["audit"]``) with the decision it resumes.
    """

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.loaded: tuple[Decision, Spans] | None = None

    def load(self, state: Mapping[str, Any], decision: Decision) -> None:
        """Keep the record of a checked ``state`` that resumes at ``decision``. A DataLoader
        worker's own state resumes its iteration's start and skips the batches it delivered,
        so only the record's part before that start is kept."""
        record = state.get("audit")
        if record is None:
            self.loaded = None
            return
        spans = tuple((int(low), int(high)) for low, high in record)
        if "worker" in state:
            spans = clip_spans(spans, decision.start)
        self.loaded = (Decision(*decision), spans)

    def before(self, decision: Decision) -> Spans | None:
        """The batches consumed before an iteration that reads ``decision``: none from the
        epoch's start; the loaded record if it resumes that one; else ``None`` (unknown)."""
        if decision.start == 0:
            return ()
        if self.loaded is not None and self.loaded[0] == decision:
            return self.loaded[1]
        return None

    def stamp(self, state: dict[str, Any], audit: EpochAudit | None) -> dict[str, Any]:
        """``state`` with ``state["audit"]``, the batches of its epoch consumed before its
        ``position`` (the position the state reports, at most the epoch's end), where known:
        the loaded record if the state is where that one resumes; none at position 0; else the
        latest iteration's (``audit``) record of the same epoch joined with ``[its start,
        position)``. Unknown (an epoch resumed from a state without a record): no key."""
        position = state["position"]
        here = Decision(state["epoch"], position)
        if self.loaded is not None and self.loaded[0] == here:
            spans: Spans | None = self.loaded[1]
        elif position == 0:
            spans = ()
        elif audit is None or audit.before is None or audit.plan.epoch != here.epoch:
            spans = None
        elif audit.plan.start > position:
            spans = None
        else:
            end = end_position(state["num_rows"], state["batch_size"], drop_last=state["drop_last"])
            spans = add_span(audit.before, audit.plan.start, min(position, end))
        if spans is not None:
            state["audit"] = [[low, high] for low, high in spans]
        return state


class EpochAudit:
    """Records one iteration's deliveries and, at its end, runs the check.

    Args:
        plan (EpochPlan): what the iteration reads.
        share (Share): which of the plan's batches it hands out.
        exchange (str): ``"dir"``, ``"local"`` or ``"dist"`` (:func:`choose_exchange`).
        audit_dir (str, optional): the folder, for ``"dir"``.
        identity (Mapping): the loader's identity (``uri``, ``version``, ``seed``, ...): what every
            record of the epoch must agree on, with the plan's fields.
        before (tuple, optional): the epoch's batches consumed before ``plan.start`` (a
            checkpoint's record; ``None``: unknown, only the rest of the epoch is checked).
        key (str, optional): the iteration's name in ``audit_dir``'s ledger.

    Attributes:
        report (AuditReport | None): the verdict, once this process checked the epoch.
    """

    def __init__(
        self,
        plan: EpochPlan,
        share: Share,
        *,
        exchange: str,
        audit_dir: str | os.PathLike[str] | None,
        identity: Mapping[str, Any],
        before: Spans | None = (),
        key: str = "",
    ) -> None:
        self.plan, self.share, self.exchange, self.audit_dir = plan, share, exchange, audit_dir
        self.before = before
        self.rule = {
            **identity,
            "uri": redact_uri(identity["uri"]),
            "shuffle": plan.shuffle,
            "world_size": plan.world_size,
            "epoch": plan.epoch,
            "start": plan.start,
            "before": None if before is None else [list(s) for s in before],
        }
        self.record = CoverageRecord(plan.num_rows)
        self.report: AuditReport | None = None
        self._finished = False
        self._number = 0
        if exchange == "dir":  # numbered as it begins: every rank's n-th iteration meets
            Path(audit_dir).mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
            self._number = _number(Path(audit_dir), share.rank, key)  # type: ignore[arg-type]

    def add(self, indices: np.ndarray) -> None:
        """One batch handed out (its row offsets)."""
        self.record.add(indices)

    def finish(self) -> AuditReport | None:
        """The share was handed out to its end: exchange, and check if this process is the one
        that does; the report (``None``: checked elsewhere, or not yet). Once only.

        Raises:
            CoverageError: the check failed (here).
            RuntimeError: the ``torch.distributed`` exchange failed (a rank did not reach the
                epoch's end within :data:`EXCHANGE_TIMEOUT_S`).
            OSError: the record could not be written into ``audit_dir``.
        """
        if self._finished:
            return self.report
        self._finished = True
        delivered = self.record.delivered()
        exchange = {"local": self._local, "dir": self._dir, "dist": self._dist}[self.exchange]
        self.report = report = exchange(delivered)
        if report is None:
            logger.debug(
                "coverage audit of epoch %d: %s's record is in, checked elsewhere",
                self.plan.epoch,
                self.share,
            )
        elif report.ok:
            logger.info("%s", report.summary())
        else:
            raise CoverageError(report.failure(), report=report)
        return report

    def _check(self, shares: list[Share], records: Iterator[Delivered]) -> AuditReport:
        return check(
            self.plan,
            shares,
            records,
            uri=self.rule["uri"],
            version=self.rule["version"],
            before=self.before,
        )

    def _local(self, delivered: Delivered) -> AuditReport:
        return self._check([self.share], iter([delivered]))

    # -- through a folder ------------------------------------------------------------------------
    def _dir(self, delivered: Delivered) -> AuditReport | None:
        folder, share = Path(self.audit_dir), self.share  # type: ignore[arg-type]
        group = f"iteration{self._number}"
        name = (
            f"{group}-rank{share.rank}of{self.plan.world_size}-worker{share.worker_id}of"
            f"{share.num_workers}.npz"
        )
        _write_atomically(
            folder / name,
            lambda f: np.savez(
                f,
                bits=delivered.bits,
                repeats=delivered.repeats,
                counts=np.array([delivered.batches, delivered.rows, share.skip], dtype=np.int64),
                rule=np.array(json.dumps(self.rule)),
            ),
        )
        report = self._check_group(folder, group)
        if report is None or report.ok:  # else this one's failure is raised first
            _learn(folder, share.rank)  # an earlier iteration's failure, checked elsewhere
        return report

    def _check_group(self, folder: Path, group: str) -> AuditReport | None:
        """Check ``group`` if every record is in and no other process claimed it."""
        if not _complete(_found(folder, group)):
            return None
        claim = folder / f"{group}.checking"
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return None  # another process is checking
        try:
            found = _found(folder, group)
            if not _complete(found):  # checked and removed meanwhile
                return None
            try:
                report = self._check_files({share: path for share, (path, _) in found.items()})
            except CoverageError as error:  # the records disagree on what they read
                self._conclude(folder, group, found, {"ok": False, "failure": str(error)})
                raise
            self._conclude(
                folder,
                group,
                found,
                {
                    **json.loads(report.to_json()),
                    "failure": None if report.ok else report.failure(),
                },
            )
        finally:
            claim.unlink(missing_ok=True)
        return report

    def _conclude(
        self, folder: Path, group: str, found: dict[Share, tuple[Path, int]], verdict: dict
    ) -> None:
        """Write ``group``'s report; a failure also for each other rank to take; remove the
        records."""
        _write_atomically(
            folder / f"{group}-report.json",
            lambda f: f.write(json.dumps(verdict, indent=1).encode()),
        )
        if not verdict["ok"]:
            told = {"failure": verdict["failure"], "checked_by": str(self.share)}
            for rank in sorted({share.rank for share in found} - {self.share.rank}):
                _write_atomically(
                    folder / f"{group}-rank{rank}.failed",
                    lambda f: f.write(json.dumps(told).encode()),
                )
        for path, _ in found.values():
            path.unlink(missing_ok=True)

    def _check_files(self, found: dict[Share, Path]) -> AuditReport:
        shares, rules, counts = [], [], []
        for share, path in found.items():
            with np.load(path, allow_pickle=False) as data:
                batches, rows, skip = data["counts"].tolist()
                rules.append((share, json.loads(str(data["rule"]))))
            shares.append(share._replace(skip=skip))
            counts.append((batches, rows))
        self._agree(rules)

        def records() -> Iterator[Delivered]:  # the bitmaps read one at a time
            for path, (batches, rows) in zip(found.values(), counts, strict=True):
                with np.load(path, allow_pickle=False) as data:
                    yield Delivered(data["bits"], data["repeats"], batches, rows)

        return self._check(shares, records())

    def _agree(self, rules: list[tuple[Share, Mapping[str, Any]]]) -> None:
        """Raise :class:`CoverageError` if the records read different rules."""
        problem = disagreement([(self.share, self.rule), *rules])
        if problem is not None:
            raise CoverageError(
                f"coverage audit of epoch {self.plan.epoch} of {self.rule['uri']!r} version "
                f"{self.rule['version']} FAILED: {problem}"
            )

    # -- through torch.distributed ---------------------------------------------------------------
    def _dist(self, delivered: Delivered) -> AuditReport:
        group = _audit_group()
        world_size, rank = self.plan.world_size, self.share.rank
        mine = {
            "rule": self.rule,
            "share": tuple(self.share),
            "repeats": delivered.repeats,
            "counts": (delivered.batches, delivered.rows),
        }
        heads: list[Any] = [None] * world_size
        _collective(lambda: dist.all_gather_object(heads, mine, group=group))
        shares = [Share(*head["share"]) for head in heads]
        self._agree([(share, head["rule"]) for share, head in zip(shares, heads, strict=True)])
        if rank != 0:
            _collective(lambda: dist.send(torch.from_numpy(delivered.bits), dst=0, group=group))
            box: list[Any] = [None]
            _collective(lambda: dist.broadcast_object_list(box, src=0, group=group))
            if isinstance(box[0], BaseException):
                raise RuntimeError("coverage audit: the check failed on rank 0") from box[0]
            return box[0]

        def records() -> Iterator[Delivered]:
            for source, head in enumerate(heads):
                bits = delivered.bits
                if source:
                    received = torch.empty(len(bits), dtype=torch.uint8)
                    _collective(functools.partial(dist.recv, received, src=source, group=group))
                    bits = received.numpy()
                yield Delivered(bits, head["repeats"], *head["counts"])

        stream = records()
        try:
            result: Any = self._check(shares, stream)
        except Exception as exc:  # the others must not wait for a verdict that never comes
            result = exc
            for _ in stream:  # nor in send(): receive what the check did not
                pass
        _collective(lambda: dist.broadcast_object_list([result], src=0, group=group))
        if isinstance(result, BaseException):
            raise result
        return result


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _audit_group() -> Any:
    """The audit's gloo group of every rank, made once per default process group."""
    world = dist.group.WORLD
    if not _GROUP or _GROUP[0] is not world:
        timeout = datetime.timedelta(seconds=EXCHANGE_TIMEOUT_S)
        _GROUP[:] = [world, dist.new_group(backend="gloo", timeout=timeout)]
    return _GROUP[1]


def _collective(operation: Callable[[], Any]) -> Any:
    """Run one step of the exchange; a failure (a timeout) says what it means for the audit."""
    try:
        return operation()
    except RuntimeError as exc:
        raise RuntimeError(
            f"coverage audit: the torch.distributed exchange at the epoch's end failed "
            f"({type(exc).__name__}: {exc}); every rank must read the epoch to its end (a rank "
            f"that stops early leaves the others waiting up to {EXCHANGE_TIMEOUT_S:.0f} s), or "
            f"pass audit=Audit(dir=...) to exchange through a folder instead"
        ) from exc


def _number(folder: Path, rank: int, key: str) -> int:
    """The iteration ``key``'s number among those rank ``rank`` began over ``folder``: ``key``
    appended to the rank's ledger (one short ``O_APPEND`` write), then the place of its first
    line among the distinct keys (the DataLoader workers of one iteration append the same key,
    in any order with the next iteration's)."""
    ledger = folder / f"rank{rank}.iterations"
    descriptor = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, f"{key}\n".encode())
    finally:
        os.close(descriptor)
    numbers: dict[str, int] = {}
    for line in ledger.read_text().split():
        numbers.setdefault(line, len(numbers) + 1)
    return numbers[key]


def _learn(folder: Path, rank: int) -> None:
    """Raise the failure another process's check left for rank ``rank`` (the earliest), taking
    it (a rename: one process of the rank raises it)."""
    if not folder.is_dir():
        return
    pattern = re.compile(rf"^iteration(\d+)-rank{rank}\.failed$")
    waiting = sorted(
        (int(m.group(1)), m.group(0)) for m in map(pattern.match, os.listdir(folder)) if m
    )
    for number, name in waiting:
        taken = folder / f".{name}.{os.getpid()}.taken"
        try:
            os.rename(folder / name, taken)
        except FileNotFoundError:
            continue  # another process of the rank took it
        try:
            told = json.loads(taken.read_text())
        finally:
            taken.unlink(missing_ok=True)
        raise CoverageError(
            f"coverage audit of this rank's iteration {number} over the audit's folder, checked by "
            f"{told['checked_by']}: {told['failure']}"
        )


def _found(folder: Path, group: str) -> dict[Share, tuple[Path, int]]:
    """The records of ``group`` (the ranks' ``n``-th iterations) in ``folder``, by share (in
    order), each with the world size its rule has."""
    found = {}
    for path in folder.iterdir():
        match = _RECORD.match(path.name)
        if match and match.group(1) == group:
            rank, world_size, worker, workers = (int(match.group(i)) for i in (2, 3, 4, 5))
            found[Share(rank, worker, workers)] = (path, world_size)
    return dict(sorted(found.items()))


def _complete(found: dict[Share, tuple[Path, int]]) -> bool:
    """Whether ``found`` holds every share for one of the world sizes its records claim (records
    that claim others are then compared, and differ)."""
    return any(complete(found, size) for size in {size for _, size in found.values()})


def _write_atomically(path: Path, write: Any) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then ``os.replace``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            write(file)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
