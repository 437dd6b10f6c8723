"""The pinned version of an open dataset: :func:`checkout` (with the error that names the
latest version and the tags), :func:`committed`, the version's commit time, and :func:`history`,
its fragments, versions and tags. It works on the ``lance.LanceDataset`` that
:mod:`lance_prefetch.sources._lance` opened; it imports no Lance itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["History", "checkout", "committed", "history"]


@dataclass(frozen=True)
class History:
    """A dataset's layout and history, as :func:`history` reads them.

    Attributes:
        fragments (int): fragments of the pinned version.
        versions (tuple[tuple[int, str], ...]): every version of the dataset, oldest first, as
            ``(version, commit time in ISO 8601)``.
        tags (dict[str, int]): each tag's name and the version it names, sorted by name.
    """

    fragments: int
    versions: tuple[tuple[int, str], ...]
    tags: dict[str, int]


def history(dataset: Any) -> History:
    """The fragments of ``dataset``'s checked-out version, and the dataset's versions and tags
    (``dataset`` a ``lance.LanceDataset``; one manifest listing, no data read)."""
    versions = tuple(
        (int(entry["version"]), _iso(entry.get("timestamp"))) for entry in dataset.versions()
    )
    tags = {name: int(tag["version"]) for name, tag in sorted(dataset.tags.list().items())}
    return History(len(dataset.get_fragments()), versions, tags)


def _iso(timestamp: Any) -> str:
    if timestamp is None:
        return ""
    return timestamp.isoformat() if hasattr(timestamp, "isoformat") else str(timestamp)


def checkout(dataset: Any, version: int | str, uri: str) -> Any:
    """``dataset`` (a ``lance.LanceDataset``) at ``version`` (a number or a tag).

    Raises:
        ValueError: the version does not exist in ``uri``; the message gives the latest version,
            and for a tag the dataset's tags (and, for a tag spelled as digits, the int to pass).
    """
    latest = dataset.latest_version
    message = f"version={version!r} does not exist in {uri!r}; its latest version is {latest}"
    if isinstance(version, int) and version > latest:
        # refused at once: Lance's checkout of a manifest that is not there sometimes retries
        # for ~10 s before it gives up
        raise ValueError(message)
    try:
        return dataset.checkout_version(version)
    except (ValueError, OSError, KeyError, OverflowError) as exc:
        if isinstance(version, str):  # a tag
            message += _tags(dataset)
            if version.strip().isdigit():
                message += f" (a str names a tag; for version number {int(version)} pass an int)"
        raise ValueError(message) from exc


def committed(dataset: Any) -> str:
    """When ``dataset``'s version was committed (ISO 8601, from its manifest; ``""`` if Lance
    does not say)."""
    try:
        timestamp = dataset.get_version()["timestamp"]
    except Exception:  # older or newer Lance: the version number alone keys caches
        return ""
    return _iso(timestamp)


def _tags(dataset: Any) -> str:
    """``", and its tags are [...]"`` for a message (empty if the tags cannot be listed)."""
    try:
        tags = sorted(dataset.tags.list())
    except Exception:  # the message is about the version; a failed listing must not replace it
        return ""
    return f", and its tags are {tags}" if tags else ", and it has no tags"
