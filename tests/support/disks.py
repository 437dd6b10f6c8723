"""A small disk that fills up on cue, for the disk cache's fault tests (:class:`SmallDisk`)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

import lance
import pyarrow as pa

from lance_prefetch.cache import _columns

#: The error Lance raises when a write meets a full disk (measured on a full tmpfs, pylance 14),
#: raised by the injected failure.
LANCE_ENOSPC = "LanceError(IO): No space left on device (os error 28), injected by SmallDisk"
#: The error a raw column file's write raises when injected (``str`` of the ``OSError``).
RAW_ENOSPC = "[Errno 28] No space left on device, injected by SmallDisk"


class SmallDisk:
    """A folder whose disk is full while :meth:`fill` holds (until :meth:`free`).

    ``kind="tmpfs"``: a tmpfs of ``size`` bytes mounted at ``path`` when this process may mount
    (root with ``CAP_SYS_ADMIN``, as on the development machine); :meth:`fill` writes a ballast
    file that leaves ``leave`` bytes free, and a write past them fails in the kernel (ENOSPC).
    Where mounting is refused, and with ``kind="injected"``: a plain folder, and while full every
    ``lance.write_dataset`` writes the first record batch of its data into its target for real,
    then raises Lance's own ENOSPC error, and every write of a disk copy's raw column file
    writes half of its bytes, then raises ``OSError`` ENOSPC: the same partial files and the same
    errors for the cleanup to handle. :attr:`mounted` says which one runs. Use it as a context manager (the
    tmpfs is unmounted and the patch undone at its end)."""

    def __init__(self, path: Path, *, size: int, kind: str, monkeypatch) -> None:
        self.path, self.size, self.kind = Path(path), size, kind
        self._monkeypatch = monkeypatch
        self.mounted = False
        self.full = False

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.kind == "tmpfs":
            self.mounted = _mount_tmpfs(self.path, self.size)
        if not self.mounted:
            self._inject()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.mounted:
            done = subprocess.run(["umount", str(self.path)], capture_output=True, timeout=30)
            if done.returncode:
                subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30)

    @property
    def ballast(self) -> Path:
        return self.path / "ballast"

    def fill(self, *, leave: int) -> None:
        """Make the disk full but ``leave`` bytes (a tmpfs), or make writes fail (injected)."""
        self.full = True
        if self.mounted:
            free = shutil.disk_usage(self.path).free
            with open(self.ballast, "wb") as file:
                file.write(b"\0" * (free - leave))

    def free(self) -> None:
        """Give the space back: the next writes succeed."""
        self.full = False
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.ballast)

    def _inject(self) -> None:
        original = lance.write_dataset
        disk = self

        def write_dataset(data, uri, *args, **kwargs):
            if not (disk.full and str(uri).startswith(str(disk.path))):
                return original(data, uri, *args, **kwargs)
            first = data.read_next_batch()  # the fill's scan, one record batch of it
            original(pa.Table.from_batches([first]), uri, *args, **kwargs)  # partial files
            raise OSError(LANCE_ENOSPC)

        self._monkeypatch.setattr(lance, "write_dataset", write_dataset)
        original_write = _columns._write

        def write(file, values):
            if not (disk.full and str(file.name).startswith(str(disk.path))):
                return original_write(file, values)
            original_write(file, values[: len(values) // 2])  # partial bytes
            raise OSError(errno.ENOSPC, RAW_ENOSPC.removeprefix("[Errno 28] "))

        self._monkeypatch.setattr(_columns, "_write", write)


def _mount_tmpfs(path: Path, size: int) -> bool:
    """Mount a tmpfs of ``size`` bytes at ``path``; whether it worked."""
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):  # no mount command, or it hung
        return False
    return done.returncode == 0


class ReadOnlyFolder:
    """``source`` seen read-only at ``path``: a read-only bind mount where this process may mount
    (``kind="mount"``, root with ``CAP_SYS_ADMIN``), else (and with ``kind="injected"``) ``path``
    is ``source`` itself and every write, replace or unlink of a path under it raises
    ``OSError`` ``EROFS``, as the kernel does on a read-only mount (an unlink of a missing file
    included). :attr:`mounted` says which one runs; a context manager."""

    def __init__(self, source: Path, path: Path, *, kind: str, monkeypatch) -> None:
        self.source, self.path, self.kind = Path(source), Path(path), kind
        self._monkeypatch = monkeypatch
        self.mounted = False

    def __enter__(self) -> ReadOnlyFolder:
        if self.kind == "mount":
            self.path.mkdir(parents=True)
            self.mounted = _run(["mount", "--bind", str(self.source), str(self.path)])
            if self.mounted and not _run(["mount", "-o", "remount,ro,bind", str(self.path)]):
                self.__exit__()
                self.mounted = False
        if not self.mounted:
            self.path = self.source
            self._inject()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.mounted and not _run(["umount", str(self.path)]):
            _run(["umount", "-l", str(self.path)])

    def _inject(self) -> None:
        folder = f"{self.path}{os.sep}"

        def refused(path) -> None:
            if os.fspath(path).startswith(folder):
                raise OSError(errno.EROFS, "Read-only file system (injected)", os.fspath(path))

        def guard(owner, name: str) -> None:
            original = getattr(owner, name)

            def guarded(path, *args, **kwargs):
                refused(path)
                return original(path, *args, **kwargs)

            self._monkeypatch.setattr(owner, name, guarded)

        for name in ("write_text", "write_bytes", "unlink", "mkdir", "touch"):
            guard(Path, name)
        original_replace = os.replace

        def replace(source, target, *args, **kwargs):
            refused(source)
            refused(target)
            return original_replace(source, target, *args, **kwargs)

        self._monkeypatch.setattr(os, "replace", replace)


def _run(command: list[str]) -> bool:
    """Whether ``command`` ran and succeeded (within 30 s)."""
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
