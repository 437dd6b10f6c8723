"""Scheduling: the producer that runs takes ahead of the consumer within a readahead budget, its
worker threads, hedged takes, retries (:mod:`~lance_prefetch.schedule.retry`, public) and the
self-tuner of its depth. It reads through an injected fetch function and never imports Lance."""
