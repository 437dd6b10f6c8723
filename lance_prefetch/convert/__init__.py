"""Conversion: Arrow tables to torch tensors (the rules are in :mod:`lance_prefetch.convert._arrow`
and re-exported here), token sequences (:mod:`~lance_prefetch.convert.tokens`), struct-column
projection, and device placement (pinned memory, a device copy one batch ahead)."""

from lance_prefetch.convert._arrow import check_schema, fixed_row_bytes, to_tensors

__all__ = ["check_schema", "fixed_row_bytes", "to_tensors"]
