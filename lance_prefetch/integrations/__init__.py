"""The training frameworks: what the loader knows of Accelerate's and Ray Train's wrappers (the
batches they read ahead), and Lightning's callbacks
(:class:`~lance_prefetch.integrations.lightning.LoaderEpochs`,
:class:`~lance_prefetch.integrations.lightning.LoaderStatsLogger`)."""
