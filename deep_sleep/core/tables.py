"""The columns of every table Deep Sleep reads or writes, in one place.

One description serves the extract's SELECT list, the snapshot's Parquet schema (SPEC §8:
uuid as canonical lowercase text, jsonb as UTF-8 JSON text, timestamps as UTC microseconds,
embeddings as fixed-size lists of float32), empty frames for tables a hand-written snapshot
leaves out, and the casts of the apply's staging tables.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import polars as pl

from deep_sleep.core.errors import InputError

EMBEDDING_DIM = 256
SCHEMA_VERSION = 1

TS = pl.Datetime("us", "UTC")
# How snapshots and diffs are written: zstd level 1 writes ~3× faster than the default level 3
# for the same size; readers need nothing special.
PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 1, "statistics": False}


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    kind: str  # uuid | text | json | ts | float | int | floats (float8[]) | vector

    @property
    def dtype(self) -> pl.DataType:
        return _DTYPES[self.kind]

    @property
    def select_sql(self) -> str:
        """How the extract reads the column so Arrow gets the snapshot's type directly."""
        if self.kind in ("uuid", "json"):
            return f"{self.name}::text AS {self.name}"
        return self.name

    def cast_sql(self, ref: str) -> str:
        """How the apply turns a staged (Arrow-typed) column back into the Postgres type."""
        return {
            "uuid": f"{ref}::uuid",
            "json": f"{ref}::jsonb",
            "vector": f"{ref}::real[]::vector",
        }.get(self.kind, ref)


_DTYPES: dict[str, pl.DataType] = {
    "uuid": pl.String(),
    "text": pl.String(),
    "json": pl.String(),
    "ts": TS,
    "float": pl.Float64(),
    "int": pl.Int64(),
    "floats": pl.List(pl.Float64()),
    "vector": pl.Array(pl.Float32(), EMBEDDING_DIM),
}


def _cols(spec: str) -> tuple[Column, ...]:
    return tuple(Column(*item.split(":")) for item in spec.split())


# The columns a snapshot carries.  Node and event embeddings stay in Postgres: no phase reads
# them, and at a million nodes they would be most of the bytes moved (docs/semantics.md, "Snapshot").
TABLES: dict[str, tuple[Column, ...]] = {
    "memory_nodes": _cols(
        "id:uuid scope_path:text tenant_id:text layer:text label:text properties:json "
        "importance:float access_count:int created_at:ts updated_at:ts last_decayed_at:ts version:int"
    ),
    "memory_edges": _cols(
        "id:uuid scope_path:text tenant_id:text source_id:uuid target_id:uuid relation:text weight:float "
        "properties:json created_at:ts updated_at:ts valid_from:ts valid_to:ts version:int"
    ),
    "episodic_events": _cols(
        "id:uuid scope_path:text tenant_id:text session_id:text content:text metadata:json created_at:ts version:int"
    ),
    "memory_access_log": _cols("id:int scope_path:text node_id:uuid accessed_at:ts kind:text"),
    "procedural_skills": _cols(
        "id:uuid scope_path:text tenant_id:text name:text description:text steps:json status:text source:text "
        "pattern_key:text occurrences:int embedding:vector created_at:ts updated_at:ts version:int"
    ),
    "prospective_triggers": _cols(
        "id:uuid scope_path:text tenant_id:text condition:text action:text due_at:ts status:text "
        "created_at:ts updated_at:ts version:int"
    ),
    "soul_profiles": _cols("id:uuid scope_path:text tenant_id:text key:text value:text updated_at:ts version:int"),
    "pending_connections": _cols(
        "id:uuid scope_path:text tenant_id:text source_label:text target_label:text relation:text weight:float "
        "created_at:ts consumed_by_run:uuid outcome:text version:int"
    ),
    "recall_events": _cols(
        "id:uuid scope_path:text tenant_id:text query:text node_id:uuid similarity:float features:floats "
        "score:float label:float label_source:text trained_at:ts created_at:ts version:int"
    ),
    "reranker_models": _cols(
        "id:uuid scope_path:text tenant_id:text weights:floats bias:float steps:int updated_at:ts version:int"
    ),
}

# Columns a diff may write that a snapshot does not carry: the vector of a node consolidation creates
# or relabels (SPEC §5 as amended: computed in the transform, written by the apply) and its model.
WRITE_ONLY: dict[str, tuple[Column, ...]] = {
    "memory_nodes": _cols("embedding:vector embedding_model:text"),
}

# Tables a phase may change (everything but the append-only access log).
MUTABLE = tuple(t for t in TABLES if t != "memory_access_log")


def columns(table: str) -> dict[str, Column]:
    """The columns of ``table`` a snapshot carries."""
    try:
        return {c.name: c for c in TABLES[table]}
    except KeyError:
        raise InputError(f"unknown table {table!r}; Deep Sleep knows {', '.join(TABLES)}") from None


def diff_columns(table: str) -> dict[str, Column]:
    """The columns a diff of ``table`` may write: the snapshot's, and :data:`WRITE_ONLY`'s."""
    return {**columns(table), **{c.name: c for c in WRITE_ONLY.get(table, ())}}


def schema(table: str) -> pl.Schema:
    return pl.Schema({c.name: c.dtype for c in TABLES[table]})


def empty(table: str) -> pl.DataFrame:
    return pl.DataFrame(schema=schema(table))


def conform(table: str, df: pl.DataFrame, only: Collection[str] | None = None) -> pl.DataFrame:
    """Cast a frame to the table's snapshot schema (or to its ``only`` columns); absent columns
    become nulls, extra columns stay.

    Raises :class:`InputError` (a ValueError) naming the column when a value cannot be cast.
    """
    out = []
    for col in TABLES[table]:
        if only is not None and col.name not in only:
            continue
        if col.name in df.columns:
            try:
                series = df.get_column(col.name)
                # No cast when the type is right: a cast of an all-null column returns one chunk, and a
                # frame whose columns are chunked differently is copied whole by every later select.
                out.append(series if series.dtype == col.dtype else series.cast(col.dtype))
            except Exception as exc:  # polars raises several error types for bad casts
                raise InputError(
                    f"{table}.{col.name}: cannot read values as {col.kind} ({col.dtype}): {exc}"
                ) from exc
        else:
            out.append(pl.Series(col.name, [], dtype=col.dtype).extend_constant(None, df.height))
    extra = [df.get_column(c) for c in df.columns if c not in columns(table)]
    return pl.DataFrame(out + extra)
