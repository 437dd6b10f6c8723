"""Planning: which rows each batch of an epoch holds, pure arithmetic with no I/O and no threads.

The public rule books are :mod:`~lance_prefetch.plan.sampling` (which rows in which batch),
:mod:`~lance_prefetch.plan.permutation` (each epoch's order) and
:mod:`~lance_prefetch.plan.splits` (which rows form which part of a split). The private modules
hold the mixture counts, the coalescing of batches into takes, the position algebra of
checkpoints and the seeds. Nothing here imports Lance, torch or a thread.
"""
