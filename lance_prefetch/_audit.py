"""The coverage audit's wiring (``PrefetchLoader(audit=True)``): :class:`EpochAudit` records every
batch an iteration hands out and, at the epoch's end, brings the records of every rank and
DataLoader worker together and checks them (:mod:`lance_prefetch._coverage`).

How records meet (:func:`choose_exchange`, decided when an iteration begins):

1. ``audit_dir`` given: the folder. Each process writes its record there atomically (a temporary
   file, then ``os.replace``) when its share of the epoch is handed out. The first writer to find
   every expected record claims the check (a file created with ``O_EXCL``), checks, writes
   ``epoch<e>-from<start>-report.json`` and removes the records. Nothing waits for another
   process, so nothing can hang; the verdict is raised (or logged) in the process that checked,
   the others' epochs end as usual.
2. A single record in all (one rank, or one reader of every rank, without DataLoader workers):
   checked where it is.
3. ``torch.distributed`` initialised with the loader's ranks (not in a DataLoader worker): over a
   gloo group of the audit's own (made at the first audited iteration, so the exchange never
   interleaves with the training's collectives, on CPU tensors whatever the training's backend).
   Rank 0 gathers the records one by one and checks; every rank gets the verdict and raises the
   same :class:`~lance_prefetch.CoverageError`. A collective: every rank must read the epoch to
   its end (with ``shuffle=False`` ranks may end a batch apart; the first waits there, at most
   :data:`EXCHANGE_TIMEOUT_S`).
4. Otherwise: ``ValueError`` naming ``audit_dir``.

An epoch not read to its end (``break``, an error, ``close()``) is not audited and leaves no record.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ._bitset import CoverageRecord, Delivered
from ._coverage import AuditReport, Share, check, complete, disagreement
from ._errors import CoverageError
from ._storage import redact_uri
from .sampling import EpochPlan

__all__ = ["EXCHANGE_TIMEOUT_S", "EpochAudit", "choose_exchange", "open_audit"]

logger = logging.getLogger("lance_prefetch.audit")

#: Seconds a rank waits in the torch.distributed exchange for the others to reach the epoch's end.
EXCHANGE_TIMEOUT_S = 300.0

_RECORD = re.compile(r"^epoch(\d+)-from(\d+)-rank(-?\d+)-worker(\d+)of(\d+)\.npz$")
_GROUP: list[Any] = []  # [default group, the audit's gloo group] once made in this process


def choose_exchange(config: Any, share: Share, world_size: int, *, in_worker: bool) -> str | None:
    """How the records of an iteration reading ``share`` of a ``world_size``-rank plan meet, by
    the module docstring's rules: ``"dir"``, ``"local"`` or ``"dist"``; ``None`` without
    ``config.audit`` (a :class:`~lance_prefetch._config.LoaderConfig`). Called before the
    iteration decides its epoch, so a misconfiguration uses none up.

    Raises:
        ValueError: more than one record and no way for them to meet (the message names
            ``audit_dir`` and the fix).
    """
    if not config.audit:
        return None
    if config.audit_dir is not None:
        return "dir"
    ranks = 1 if share.rank < 0 else world_size
    if ranks * share.num_workers == 1:
        return "local"
    if in_worker:
        raise ValueError(
            f"audit=True in DataLoader workers needs audit_dir=: each of the {share.num_workers} "
            f"workers is a process of its own that hands out its own batches, so their records "
            f"meet in a folder; pass audit_dir= a folder every rank and worker can write (a "
            f"shared file system across machines), or use num_workers=0"
        )
    live = (dist.get_rank(), dist.get_world_size()) if _initialised() else None
    if live != (share.rank, world_size):
        found = "no torch.distributed process group is initialized"
        if live is not None:
            found = f"the torch.distributed process group has rank {live[0]} of {live[1]}"
        raise ValueError(
            f"audit=True on rank {share.rank} of {world_size} needs the ranks' records to meet, "
            f"but {found}; initialize the process group (with these ranks) before iterating, "
            f"or pass audit_dir= a folder every rank can write"
        )
    return "dist"


def open_audit(
    exchange: str | None, plan: EpochPlan, share: Share, audit_dir: str | None, *,
    identity: Mapping[str, Any],
) -> EpochAudit | None:  # fmt: skip
    """The audit of one iteration, exchanging as :func:`choose_exchange` said (``None``: no
    audit). With ``"dist"``, makes the audit's gloo group first if this process has none yet (a
    collective: every rank does so as its first audited iteration begins)."""
    if exchange is None:
        return None
    if exchange == "dist":
        _audit_group()
    return EpochAudit(plan, share, exchange=exchange, audit_dir=audit_dir, identity=identity)


class EpochAudit:
    """Records one iteration's deliveries and, at its end, runs the check.

    Args:
        plan (EpochPlan): what the iteration reads.
        share (Share): which of the plan's batches it hands out.
        exchange (str): ``"dir"``, ``"local"`` or ``"dist"`` (:func:`choose_exchange`).
        audit_dir (str, optional): the folder, for ``"dir"``.
        identity (Mapping): the loader's identity (``uri``, ``version``, ``seed``, ...): what every
            record of the epoch must agree on, with the plan's fields.

    Attributes:
        report (AuditReport | None): the verdict, once this process checked the epoch.
    """

    def __init__(
        self, plan: EpochPlan, share: Share, *, exchange: str, audit_dir: str | None,
        identity: Mapping[str, Any],
    ) -> None:  # fmt: skip
        self.plan, self.share, self.exchange, self.audit_dir = plan, share, exchange, audit_dir
        self.rule = {**identity, "uri": redact_uri(identity["uri"]), "shuffle": plan.shuffle,
                     "world_size": plan.world_size, "epoch": plan.epoch,
                     "start": plan.start}  # fmt: skip
        self.record = CoverageRecord(plan.num_rows)
        self.report: AuditReport | None = None
        self._finished = False

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
            logger.debug("coverage audit of epoch %d: %s's record is in, checked elsewhere",
                         self.plan.epoch, self.share)  # fmt: skip
        elif report.ok:
            logger.info("%s", report.summary())
        else:
            raise CoverageError(report.failure(), report=report)
        return report

    def _check(self, shares: list[Share], records: Iterator[Delivered]) -> AuditReport:
        return check(self.plan, shares, records, uri=self.rule["uri"],
                     version=self.rule["version"])  # fmt: skip

    def _local(self, delivered: Delivered) -> AuditReport:
        return self._check([self.share], iter([delivered]))

    # -- through a folder ------------------------------------------------------------------------
    def _dir(self, delivered: Delivered) -> AuditReport | None:
        folder = _folder(self.audit_dir, self.rule)  # type: ignore[arg-type]
        folder.mkdir(parents=True, exist_ok=True)
        share, group = self.share, f"epoch{self.plan.epoch}-from{self.plan.start}"
        name = f"{group}-rank{share.rank}-worker{share.worker_id}of{share.num_workers}.npz"
        _write_atomically(folder / name, lambda f: np.savez(
            f, bits=delivered.bits, repeats=delivered.repeats,
            counts=np.array([delivered.batches, delivered.rows, share.skip], dtype=np.int64),
            rule=np.array(json.dumps(self.rule)),
        ))  # fmt: skip
        if not complete(_found(folder, group), self.plan.world_size):
            return None
        claim = folder / f"{group}.checking"
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return None  # another process is checking
        try:
            found = _found(folder, group)
            if not complete(found, self.plan.world_size):  # checked and removed meanwhile
                return None
            report = self._check_files(found)
            _write_atomically(folder / f"{group}-report.json",
                              lambda f: f.write(report.to_json().encode()))  # fmt: skip
            for path in found.values():
                path.unlink(missing_ok=True)
        finally:
            claim.unlink(missing_ok=True)
        return report

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
        mine = {"rule": self.rule, "share": tuple(self.share), "repeats": delivered.repeats,
                "counts": (delivered.batches, delivered.rows)}  # fmt: skip
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
            f"pass audit_dir= to exchange through a folder instead"
        ) from exc


def _folder(audit_dir: str, rule: Mapping[str, Any]) -> Path:
    """The loader's folder under ``audit_dir``: named for everything its epochs share."""
    shared = {k: v for k, v in rule.items() if k not in ("epoch", "start")}
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(rule["uri"]).rstrip("/").rsplit("/", 1)[-1])
    return Path(audit_dir) / f"{stem}-{digest}"


def _found(folder: Path, group: str) -> dict[Share, Path]:
    """The records of ``group`` (an epoch from a start) in ``folder``, by share (in order)."""
    found = {}
    for path in folder.iterdir():
        match = _RECORD.match(path.name)
        if match and path.name.startswith(f"{group}-"):
            rank, worker, workers = (int(match.group(i)) for i in (3, 4, 5))
            found[Share(rank, worker, workers)] = path
    return dict(sorted(found.items()))


def _write_atomically(path: Path, write: Any) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then ``os.replace``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            write(file)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
