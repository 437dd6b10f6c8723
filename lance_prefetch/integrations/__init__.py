"""The training frameworks: what the loader knows of Accelerate's and Ray Train's wrappers (the
batches they read ahead), and Lightning's :class:`~lance_prefetch.integrations.lightning.LoaderEpochs`."""
