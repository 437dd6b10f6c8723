"""The pinned version of an open dataset: :func:`checkout` (with the error that names the
latest version and the tags), and :func:`committed`, the version's commit time. It works on the
``lance.LanceDataset`` that :mod:`lance_prefetch.sources._lance` opened; it imports no Lance itself."""

from __future__ import annotations

from typing import Any

__all__ = ["checkout", "committed"]


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
    return timestamp.isoformat() if hasattr(timestamp, "isoformat") else str(timestamp)


def _tags(dataset: Any) -> str:
    """``", and its tags are [...]"`` for a message (empty if the tags cannot be listed)."""
    try:
        tags = sorted(dataset.tags.list())
    except Exception:  # the message is about the version; a failed listing must not replace it
        return ""
    return f", and its tags are {tags}" if tags else ", and it has no tags"
