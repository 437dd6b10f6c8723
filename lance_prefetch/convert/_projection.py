"""Which fields of a dataset the ``columns`` option names, and the one table every read returns.

``columns`` holds top-level names (``"label"``) and paths into struct columns (``"image.bytes"``;
Lance refuses a ``.`` in a top-level name, so a dotted name is always a path). Lance answers the
same projection in three shapes: ``take`` nests a path back into its struct (``image:
struct<bytes>``), a scan flattens it (``image.bytes``), and a blob column (large binary stored out
of line, ``lance-encoding:blob``) comes back as a descriptor struct, its bytes read separately.
:class:`Projection` turns each into the same flat table: one column per requested name, in the
requested order, blob columns as ``large_binary``. It is pure pyarrow: the reads stay in
:mod:`lance_prefetch.sources._lance`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["BLOB_KEY", "Projection", "field_at", "is_blob"]

#: The field metadata that makes Lance store a large binary column out of line.
BLOB_KEY = b"lance-encoding:blob"
_BLOB_EXTENSION = "lance.blob.v2"  # the type Lance reports for blobs in files of version 2.2+


def is_blob(field: pa.Field) -> bool:
    """Whether ``field`` (of a Lance dataset's schema) is a blob column, of either form: the
    legacy ``large_binary`` with ``lance-encoding:blob`` metadata, or Lance's blob extension type."""
    if getattr(field.type, "extension_name", None) == _BLOB_EXTENSION:
        return True
    return (field.metadata or {}).get(BLOB_KEY) == b"true"


class Projection:
    """The requested columns of a dataset, resolved against its schema.

    Args:
        schema (pyarrow.Schema): the dataset's schema (as ``lance.LanceDataset.schema``).
        columns (Sequence[str], optional): names and dotted paths, distinct; ``None``: every
            top-level column.
        where (str): the dataset for messages, e.g. ``"the dataset 'x.lance' (version 3)"``.

    Attributes:
        columns (tuple[str, ...]): the names, as given. schema (pyarrow.Schema): the flat table
        every read returns (blob columns as ``large_binary``, keeping the blob metadata). blobs
        (tuple[str, ...]): the blob columns (or paths to blobs), read with Lance's blob API.
        read_columns (list[str]): the others, for ``take``. scan_columns (list[str]): all of them,
        for a scan that returns blobs as bytes.

    Raises:
        ValueError: a name is not a column, a path goes through a field that is not a struct or
            names no field of it, or a struct named whole holds a blob (read blobs by their path);
            the message lists what exists.
    """

    def __init__(self, schema: pa.Schema, columns: Sequence[str] | None, *, where: str) -> None:
        self.columns: tuple[str, ...] = tuple(schema.names) if columns is None else tuple(columns)
        unknown = [name for name in self.columns if name.split(".")[0] not in schema.names]
        if unknown:
            raise ValueError(
                f"columns {unknown} are not in {where}; its columns are {schema.names}"
            )
        fields = [_resolve(schema, name, where) for name in self.columns]
        self.blobs: tuple[str, ...] = tuple(f.name for f in fields if is_blob(f))
        self.read_columns: list[str] = [name for name in self.columns if name not in self.blobs]
        self.scan_columns: list[str] = list(self.columns)
        self.schema: pa.Schema = pa.schema(
            pa.field(f.name, pa.large_binary(), f.nullable, {BLOB_KEY: b"true"})
            if is_blob(f)
            else f
            for f in fields
        )
        self._storage = _nested_schema(self.schema)

    def assemble(
        self,
        table: pa.Table | pa.RecordBatch | None,
        blobs: Mapping[str, Sequence[bytes | None]],
    ) -> pa.Table:
        """The flat table of :attr:`schema` from what Lance returned.

        Args:
            table: ``take``'s table (paths nested in their structs) or a scan's batch (paths
                flat, blobs as bytes); ``None`` when only blob columns were read.
            blobs: each blob column's bytes read with the blob API, in row order.
        """
        arrays = []
        for field in self.schema:
            if field.name in blobs:
                arrays.append(pa.array(blobs[field.name], pa.large_binary()))
            else:
                column = _extract(table, field.name)
                arrays.append(column if column.type == field.type else column.cast(field.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def part(self, names: Sequence[str]) -> Projection:
        """This projection restricted to ``names`` (some of :attr:`columns`, in their order): the
        projection of a copy that holds only those columns."""
        part = copy.copy(self)
        part.columns = tuple(name for name in self.columns if name in names)
        part.blobs = tuple(name for name in self.blobs if name in names)
        part.read_columns = [name for name in self.read_columns if name in names]
        part.scan_columns = list(part.columns)
        part.schema = pa.schema([self.schema.field(name) for name in part.columns])
        part._storage = _nested_schema(part.schema)
        return part

    @property
    def storage_schema(self) -> pa.Schema:
        """The schema of :meth:`nest`'s batches: paths under their structs again (the layout a
        copy of the projection is written in; read back with the same ``columns``)."""
        return self._storage

    def nest(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch of :attr:`schema` with each path put back into its struct (only the requested
        fields; a struct requested whole keeps all of its own)."""
        tree = _tree(self.schema.names)
        arrays = [_build(tree[field.name], field, batch) for field in self._storage]
        return pa.RecordBatch.from_arrays(arrays, schema=self._storage)


def field_at(schema: pa.Schema, path: str, *, label: str, where: str) -> pa.Field:
    """The field a dotted ``path`` names (``"meta.doc"``: field ``doc`` of the struct column
    ``meta``; Lance refuses a ``"."`` in a name, so a dotted name is a path), its top-level
    column known to be in ``schema``.

    Raises:
        ValueError: a step of the path is no struct or has no such field; the message starts
            with ``label`` (what asked, e.g. ``"columns: 'a.b'"``) and names ``where``.
    """
    first, *rest = path.split(".")
    field, walked = schema.field(first), first
    for part in rest:
        if not pa.types.is_struct(field.type):
            raise ValueError(
                f"{label}: {walked!r} in {where} has type {field.type}, not a struct; name "
                f"{walked!r} itself"
            )
        names = [child.name for child in field.type]
        if part not in names:
            raise ValueError(
                f"{label}: no such field in {where}: the struct {walked!r} has the fields {names}"
            )
        field, walked = field.type.field(part), f"{walked}.{part}"
    return field


def _resolve(schema: pa.Schema, name: str, where: str) -> pa.Field:
    """The field ``name`` names, renamed ``name`` (a path's parents' nulls are its own)."""
    field = field_at(schema, name, label=f"columns: {name!r}", where=where)
    rest = name.split(".")[1:]
    if pa.types.is_struct(field.type) and _holds_blob(field):  # its descriptors, not its bytes
        raise ValueError(
            f"columns: the struct {name!r} in {where} holds a blob field, which is read by its "
            f"path; name its fields instead: {_leaves(field, name)}"
        )
    return field.with_name(name).with_nullable(field.nullable or bool(rest))


def _holds_blob(field: pa.Field) -> bool:
    return any(
        is_blob(child) or (pa.types.is_struct(child.type) and _holds_blob(child))
        for child in field.type
    )


def _leaves(field: pa.Field, name: str) -> list[str]:
    if not pa.types.is_struct(field.type) or is_blob(field):
        return [name]
    return [leaf for child in field.type for leaf in _leaves(child, f"{name}.{child.name}")]


def _extract(table: Any, name: str) -> pa.Array:
    """Column ``name`` of ``table`` (one array): by its own name (a scan's flat path, a top-level
    column), else by walking its path through the structs ``take`` nested it into."""
    names = table.schema.names
    if name in names:
        column = table.column(names.index(name))
    else:
        first, *rest = name.split(".")
        column = pc.struct_field(_whole(table.column(names.index(first))), rest)
    return _whole(column)


def _whole(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``column`` as one array: a ChunkedArray's only chunk (no copy), else its chunks combined
    (a copy; a Lance take returns one chunk)."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _tree(names: Sequence[str]) -> dict[str, Any]:
    """Paths as a tree of dicts in the order first named; a leaf is the path itself. A struct
    requested whole covers its paths (``image`` and ``image.bytes``: ``image`` is kept whole, and
    ``image.bytes`` is read from it)."""
    tree: dict[str, Any] = {}
    for name in names:
        *parents, last = name.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
            if isinstance(node, str):  # an ancestor requested whole
                break
        else:
            node[last] = name
    return tree


def _nested_schema(schema: pa.Schema) -> pa.Schema:
    def field(node: Any, name: str) -> pa.Field:
        if isinstance(node, str):
            return schema.field(node).with_name(name)
        return pa.field(name, pa.struct([field(child, part) for part, child in node.items()]))

    return pa.schema([field(node, name) for name, node in _tree(schema.names).items()])


def _build(node: Any, field: pa.Field, batch: pa.RecordBatch) -> pa.Array:
    if isinstance(node, str):
        return batch.column(batch.schema.get_field_index(node))
    children = [_build(node[child.name], child, batch) for child in field.type]
    return pa.StructArray.from_arrays(children, fields=list(field.type))
