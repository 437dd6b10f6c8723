"""Caches: row sources that wrap a Lance source and keep what it reads, in this process's memory
(:mod:`~lance_prefetch.cache._memory`) or as a local copy on disk
(:mod:`~lance_prefetch.cache._disk`), filled in a background thread."""
