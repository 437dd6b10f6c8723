"""Sources: the :class:`~lance_prefetch.sources._protocol.RowSource` protocol, the one module that
calls Lance (:mod:`~lance_prefetch.sources._lance`), object-store options, URIs, pinned versions,
and the sources that wrap others (:class:`~lance_prefetch.sources._wrapped.WrappedSource`): a
filtered or split subset, a concatenation, a mixture."""
