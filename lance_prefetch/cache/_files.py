"""The files of a disk-cache copy (:class:`~lance_prefetch.cache._disk.DiskCache`): the record written
into a copy before it is published, the check of a copy at open, the leftovers of a fill that was
killed, and the errors a full disk or a damaged copy become.

The record, ``_lance_prefetch.json`` at the copy's root, says what the copy holds (URI, version,
columns, rows) and lists every file Lance wrote with its size, CRC-32 and ``stat`` stamp (size,
inode, mtime and ctime in nanoseconds). It is written in the fill's private folder, so the atomic
rename that publishes the copy publishes the record with it. :func:`check_copy` compares a copy
with its record: a file missing, added, or of another size is damage, found with one ``stat`` a
file; a file whose stamp changed (written, truncated and regrown, touched, copied elsewhere) has
its CRC-32 computed again and compared, so bytes changed through the filesystem are found too,
while an untouched copy is opened without reading its data. Not found: bytes changed beneath
the filesystem with its timestamps left alone (media decay; the drive's own checks are for that),
and a change made within the timestamp granularity of the fill's last write (milliseconds).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import zlib
from pathlib import Path
from typing import Any

__all__ = [
    "CopyReadError",
    "RECORD",
    "check_copy",
    "crc32",
    "disk_full_message",
    "is_disk_full",
    "remove_leftovers",
    "set_aside",
    "write_record",
]

#: The record's file name, at the root of each copy.
RECORD = "_lance_prefetch.json"
_FORMAT = 2  # 2: fixed-width columns as raw files beside a Lance part; 1: Lance only
_CHUNK = 1 << 22  # CRC-32 read size: 4 MiB
_LEFTOVERS = (".partial-", ".damaged-", ".record-")
_FULL = re.compile(r"no space left on device|disk quota exceeded|os error (?:28|122)\b")


class CopyReadError(OSError):
    """A ``take`` from a disk-cache copy failed: the message names the copy and the fix. Never
    retried (a damaged local copy reads the same way again)."""

    permanent = True  # see lance_prefetch.schedule.retry.is_transient


def crc32(path: Path) -> int:
    """The CRC-32 of the file at ``path``, read in 4 MiB pieces."""
    value = 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as file:
        while count := file.readinto(buffer):
            value = zlib.crc32(view[:count], value)
    return value


def write_record(copy: Path, about: dict[str, Any]) -> None:
    """Write the record of the finished copy at ``copy``: ``about`` (what it holds, plain JSON)
    and each file's size, CRC-32 and stamp.

    Raises:
        OSError: the record cannot be written (a full disk among others).
    """
    files = {
        name: {"size": stat.st_size, "crc32": crc32(copy / name), "stamp": _stamp(stat)}
        for name, stat in _files(copy).items()
    }
    text = json.dumps({"format": _FORMAT, "about": about, "files": files}, sort_keys=True)
    (copy / RECORD).write_text(text)


def check_copy(copy: Path, about: dict[str, Any], *, read: bool = True) -> str | None:
    """``None`` if the copy at ``copy`` is the one its record describes and the record says it
    holds ``about``; otherwise what is wrong, for a message (a copy without a record was damaged
    or made by an older lance_prefetch). A file whose stamp changed but whose CRC-32 did not gets
    its new stamp recorded (best effort), so it is not read again at the next open. With
    ``read=False`` no file is read: a changed stamp is a problem ("not checked without reading")."""
    try:
        record = json.loads((copy / RECORD).read_text())
    except FileNotFoundError:
        return f"it has no {RECORD} (it was damaged, or made by an older lance_prefetch)"
    except (OSError, ValueError) as exc:  # a JSON error is a ValueError
        return f"its {RECORD} cannot be read ({type(exc).__name__}: {exc})"
    try:
        if record["format"] != _FORMAT:
            return (
                f"it is in the layout of another lance_prefetch version (its {RECORD} has "
                f"format {record['format']}, this version writes {_FORMAT})"
            )
        if record["about"] != about:
            return f"its {RECORD} describes another copy"
        recorded: dict[str, dict[str, Any]] = record["files"]
        found = _files(copy)
        missing, added = sorted(set(recorded) - set(found)), sorted(set(found) - set(recorded))
        if missing:
            return f"its file {missing[0]} is missing"
        if added:
            return f"its file {added[0]} was not there when the copy was made"
        restamped = False
        for name, entry in sorted(recorded.items()):
            stat = found[name]
            if stat.st_size != entry["size"]:
                return f"its file {name} has {stat.st_size:,} bytes, not {entry['size']:,}"
            if _stamp(stat) != entry["stamp"]:
                if not read:
                    return f"its file {name} has a new stamp (not checked without reading it)"
                if crc32(copy / name) != entry["crc32"]:
                    return f"its file {name} was changed (its CRC-32 differs)"
                entry["stamp"], restamped = _stamp(stat), True
    except (KeyError, TypeError, AttributeError) as exc:
        return f"its {RECORD} is malformed ({type(exc).__name__}: {exc})"
    if restamped:
        _replace_record(copy, record)
    return None


def remove_leftovers(cache_dir: Path, name: str) -> None:
    """Remove what fills of the copy ``name`` left in ``cache_dir`` when their process was
    killed (a private fill folder, a damaged copy set aside, a record being rewritten). Only
    while holding that copy's lock: no other process is then filling it."""
    for entry in cache_dir.iterdir():
        if entry.name.startswith(tuple(f"{prefix}{name}-" for prefix in _LEFTOVERS)):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def set_aside(copy: Path) -> None:
    """Remove the damaged copy at ``copy`` (a folder, or a file or link found in its place):
    renamed away first (atomic: the path then holds nothing until the new copy is published),
    then deleted.

    Raises:
        OSError: it cannot be renamed (the message names the path and the fix).
    """
    aside = copy.parent / f".damaged-{copy.name}-{secrets.token_hex(4)}"
    try:
        os.rename(copy, aside)
    except OSError as exc:
        raise OSError(
            f"DiskCache: the damaged copy {str(copy)!r} cannot be removed "
            f"({type(exc).__name__}: {exc}); delete it, or pass another "
            f"cache=DiskCache(dir=...)"
        ) from exc
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:  # a file, or a link (the link only, never what it points to)
        with contextlib.suppress(OSError):
            aside.unlink()


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says the disk (or a quota) is full: ``ENOSPC``/``EDQUOT``, or Lance's
    ``LanceError(IO): No space left on device (os error 28)``."""
    if not isinstance(error, OSError):
        return False
    return error.errno in (errno.ENOSPC, errno.EDQUOT) or bool(_FULL.search(str(error).lower()))


def disk_full_message(cache_dir: Path, what: str, size: int | None) -> str:
    """The message of a fill stopped by a full disk, once its partial copy is removed: what the
    copy is, its size uncompressed when known (``size``), the bytes free now, and the fixes."""
    try:
        free = f"the {shutil.disk_usage(cache_dir).free:,} bytes free there"
    except OSError:
        free = "the space free there"
    needs = "" if size is None else f", {size:,} bytes uncompressed"
    return (
        f"DiskCache: the disk of dir={str(cache_dir)!r} is full: the copy of {what}"
        f"{needs}) did not fit in {free}; nothing of it was kept. Free space there, pass "
        f"cache=DiskCache(dir=...) with a folder on a disk with room, or use cache='memory' "
        f"(rows held in each process) or cache=None (read the dataset directly)"
    )


def _files(copy: Path) -> dict[str, os.stat_result]:
    """Every file under ``copy`` but the record, by path relative to it (``/``-separated)."""
    found = {}
    for root, _, names in os.walk(copy):
        for name in names:
            path = Path(root, name)
            relative = path.relative_to(copy).as_posix()
            if relative != RECORD:
                found[relative] = path.stat()
    return found


def _stamp(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]


def _replace_record(copy: Path, record: dict[str, Any]) -> None:
    """Rewrite the record atomically, through a file beside the copy (never inside it, where a
    reader checking the copy would see a file the record does not list)."""
    temporary = copy.parent / f".record-{copy.name}-{secrets.token_hex(4)}"
    try:
        temporary.write_text(json.dumps(record, sort_keys=True))
        os.replace(temporary, copy / RECORD)
    except OSError:  # a read-only cache, a full disk: the next open checks again
        with contextlib.suppress(
            OSError
        ):  # on a read-only mount even a missing file's unlink fails
            temporary.unlink(missing_ok=True)
