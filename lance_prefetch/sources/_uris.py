"""Dataset URIs: their scheme, the ``file+uring://`` URI of Lance's io_uring reader, and a local
file given where a dataset (a directory) is expected. Pure string and path work, no Lance."""

from __future__ import annotations

import os
from pathlib import PurePath
from urllib.parse import quote, unquote, urlsplit

from lance_prefetch.sources._storage import redact_uri

__all__ = ["URING", "refuse_a_file", "remote", "scheme", "uring_uri"]

#: Lance 14's scheme for its io_uring reader of local files.
URING = "file+uring"


def uring_uri(source: str | os.PathLike[str]) -> str:
    """The ``file+uring://`` URI of a local dataset path or ``file://`` URI.

    Raises:
        ValueError: ``source`` is on an object store (io_uring reads local files only).
    """
    uri = os.fspath(source)
    kind = scheme(uri)
    if kind == URING:
        return uri
    if kind == "file":
        return URING + uri[len("file") :]
    if kind:
        raise ValueError(
            f"io='uring' reads local files only, but the dataset {redact_uri(uri)!r} is on "
            f"{kind}://; use io='default' there"
        )
    # A URI: percent signs and other reserved characters of the path are escaped, or Lance
    # would decode them ('%41.lance' would open 'A.lance').
    return f"{URING}://{quote(os.path.abspath(uri))}"


def scheme(uri: str) -> str:
    """The URI's scheme, lower case; ``""`` for a local path (a one-letter scheme is a Windows
    drive)."""
    scheme = urlsplit(uri).scheme.lower()
    return scheme if len(scheme) > 1 else ""


def remote(uri: str) -> bool:
    """Whether a dataset URI (several joined by ``" + "``, a list source's) is on an object
    store, for one of them at least."""
    return any(scheme(part) not in ("", "file", URING) for part in uri.split(" + "))


# File suffixes pyarrow.dataset reads, for the hint when a file is given as the dataset.
_FILE_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".arrow": "ipc",
    ".feather": "ipc",
    ".ipc": "ipc",
    ".json": "json",
    ".jsonl": "json",
}


def refuse_a_file(uri: str) -> None:
    """Refuse a local ``uri`` that is a file, or lies under one, before Lance tries to open it.

    Lance retries listing ``<file>/_versions`` for about two seconds before it gives up with
    "Not a directory"; this check answers at once and says what to do with the file.

    Raises:
        FileNotFoundError: ``uri`` (or one of its parent paths) is an existing file.
    """
    kind = scheme(uri)
    if kind in ("file", URING):
        path = unquote(urlsplit(uri).path)
    elif kind:  # an object store
        return
    else:
        path = uri
    for candidate in (PurePath(path), *PurePath(path).parents):
        if os.path.isdir(candidate):
            return
        if os.path.isfile(candidate):
            break
    else:
        return
    file_format = _FILE_FORMATS.get(candidate.suffix.lower())
    read = f"{str(candidate)!r}" + (f", format={file_format!r}" if file_format else "")
    raise FileNotFoundError(
        f"source: no Lance dataset at {uri!r}: {str(candidate)!r} is a file, but a Lance dataset "
        f"is a directory with a _versions/ folder; to read a Parquet, CSV or Arrow file, write "
        f"it to Lance once and pass that, e.g. "
        f"lance.write_dataset(pyarrow.dataset.dataset({read}), 'data.lance')"
    )
