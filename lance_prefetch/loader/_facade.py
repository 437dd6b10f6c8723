"""What the public readers show of their source: :class:`SourceFacade`, and the loader's
``repr`` (:func:`loader_repr`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lance_prefetch.sources._multi import ConcatSource, MixtureSource
from lance_prefetch.sources._protocol import RowSource
from lance_prefetch.sources._wrapped import SourceIdentity

__all__ = ["SourceFacade", "loader_identity", "loader_repr"]


class SourceFacade(SourceIdentity):
    """The dataset's identity as properties (``uri``, ``version``, ``columns``, ``io``), read from
    ``self._source`` (a :class:`~lance_prefetch.sources._protocol.RowSource`) as
    :class:`~lance_prefetch.sources._wrapped.SourceIdentity` reads them."""

    _source: RowSource


def loader_repr(loader: Any) -> str:
    """A :class:`~lance_prefetch.PrefetchLoader`'s ``repr``: its options as resolved (storage
    options with secret values hidden; ``shuffle``, ``filter`` and ``split`` when set)."""
    config = loader.config
    return (
        f"PrefetchLoader({loader.uri!r}, batch_size={loader.batch_size}, "
        f"columns={list(loader.columns)}, version={loader.version}, num_rows={loader.num_rows}, "
        f"seed={loader.seed}, epoch={loader.epoch}, readahead={loader.readahead!r}, "
        f"coalesce={loader.coalesce}, "
        f"cache={_shown(loader.cache)}, drop_last={loader.drop_last}, "
        + ("shuffle=False, " if not loader.shuffle else "")
        + ("" if config.audit is None else f"audit={_shown(config.audit)}, ")
        + ("" if config.filter is None else f"filter={config.filter!r}, ")
        + ("" if config.split is None else f"split={config.split!r}, ")
        + (f"weights={list(weights)}, " if (weights := _weights(loader._source)) else "")
        + f"rank={loader.rank}, "
        f"world_size={loader.world_size}, io={loader.io!r}, read={_shown(config.read)}, "
        f"storage_options={loader._source.options_repr()})"
    )


def loader_identity(loader: Any) -> dict[str, Any]:
    """What a state must match to load (:data:`lance_prefetch.state.MATCHED`); with several
    datasets, ``uri`` and ``version`` are the first one's and ``datasets`` lists them all."""
    config, source = loader.config, loader._source
    split = config.split
    several = isinstance(source, ConcatSource)  # a MixtureSource too
    return {
        "uri": source.sources[0].uri if several else loader.uri,
        "version": source.sources[0].version if several else loader.version,
        "num_rows": loader.num_rows,
        "seed": loader.seed,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "permutation": loader.permutation,
        "filter": config.filter,
        "split": None if split is None else split.to_state(),
        "datasets": source.datasets() if several else None,
        "weights": _weights(source),
    }


def _shown(group: Any) -> str:
    """An option group as its constructor call with the fields that differ from the defaults
    (``ReadOptions(max_in_flight=2)``); ``None`` as ``None``."""
    if group is None:
        return "None"
    changed = [
        f"{field.name}={getattr(group, field.name)!r}"
        for field in dataclasses.fields(group)
        if getattr(group, field.name) != field.default
    ]
    return f"{type(group).__name__}({', '.join(changed)})"


def _weights(source: RowSource) -> list[float] | None:
    """A mixture's normalised weights, else ``None``."""
    return list(source.weights) if isinstance(source, MixtureSource) else None
