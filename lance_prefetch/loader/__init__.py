"""The torch face: :class:`~lance_prefetch.loader._loader.PrefetchLoader`, its iteration, the
map-style :class:`~lance_prefetch.loader._mapstyle.LanceMapDataset`, the checked options, ranks,
epochs and statistics. It assembles the source stack and the scheduling for each iteration."""
