"""The mutation diff: what a run would change, as a frozen value (SPEC §2 step 2, §8).

Per table three frames, every row tagged with the ``phase`` that produced it:

- ``inserts``: whole new rows (snapshot columns; absent columns take the store's defaults);
- ``updates``: ``id``, ``expected_version`` (the version the phase saw) and the new values of
  the changed columns; a null means "not changed by this row" (no phase sets a column to NULL);
- ``deletes``: ``id``, ``expected_version``, ``reason``.

Several phases may update the same row; the rows stay separate here (one per phase) and are
folded into one write per row by the apply.  :meth:`Diff.combine` normalises a sequence of
phase diffs: an update or insert of a row a later phase deletes is dropped, and later updates
of a row inserted in the same run are merged into the insert.

    >>> d = Diff.empty()
    >>> d.has_changes
    False
"""

from __future__ import annotations

import functools
import hashlib
import io
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
import polars as pl

from deep_sleep.core import canonical, lookup, tables
from deep_sleep.core.errors import DiffError
from deep_sleep.core.snapshot import Snapshot

KINDS = ("inserts", "updates", "deletes")
_DELETE_SCHEMA = {"id": pl.String(), "expected_version": pl.Int64(), "reason": pl.String(), "phase": pl.String()}
_UPDATE_KEYS = {"id": pl.String(), "expected_version": pl.Int64()}
SORT_ROWS = 20_000  # the diff hash sorts smaller frames with Polars (see _by_phase_and_id)


@functools.cache  # frames are immutable values; a quick nap builds a dozen TableDiffs
def _empty(kind: str) -> pl.DataFrame:
    if kind == "deletes":
        return pl.DataFrame(schema=_DELETE_SCHEMA)
    if kind == "updates":
        return pl.DataFrame(schema={**_UPDATE_KEYS, "phase": pl.String()})
    return pl.DataFrame(schema={"id": pl.String(), "phase": pl.String()})


@dataclass(frozen=True)
class TableDiff:
    """The changes to one table."""

    inserts: pl.DataFrame = field(default_factory=lambda: _empty("inserts"))
    updates: pl.DataFrame = field(default_factory=lambda: _empty("updates"))
    deletes: pl.DataFrame = field(default_factory=lambda: _empty("deletes"))

    @property
    def has_changes(self) -> bool:
        return bool(self.inserts.height or self.updates.height or self.deletes.height)

    def frames(self) -> dict[str, pl.DataFrame]:
        return {"inserts": self.inserts, "updates": self.updates, "deletes": self.deletes}

    def counts(self) -> dict[str, int]:
        return {k: f.height for k, f in self.frames().items()}


@dataclass(frozen=True)
class Diff:
    """A whole run's (or one phase's) changes: table name → :class:`TableDiff`."""

    tables: Mapping[str, TableDiff] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.tables:
            if name not in tables.TABLES:
                raise DiffError(f"diff names unknown table {name!r}; known tables: {', '.join(tables.TABLES)}")
        object.__setattr__(self, "tables", MappingProxyType({k: v for k, v in self.tables.items() if v.has_changes}))

    # -- building --------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> Diff:
        return cls({})

    @classmethod
    def of(cls, table: str, phase: str, *, inserts=None, updates=None, deletes=None, reason: str | None = None) -> Diff:
        """One phase's diff of one table.

        ``updates`` and ``deletes`` take snapshot rows: ``id``, ``version`` and (updates) the
        changed columns with their new values.  ``inserts`` takes new rows.
        """
        td = TableDiff()
        if inserts is not None:
            td = TableDiff(inserts=inserts.with_columns(pl.lit(phase).alias("phase")), updates=td.updates, deletes=td.deletes)
        if updates is not None:
            up = updates.rename({"version": "expected_version"}).with_columns(pl.lit(phase).alias("phase"))
            td = TableDiff(inserts=td.inserts, updates=up, deletes=td.deletes)
        if deletes is not None:
            if reason is None and "reason" not in deletes.columns:
                raise DiffError(f"{phase}: deletes of {table} need a reason")
            de = deletes.select(
                pl.col("id"),
                pl.col("version").alias("expected_version"),
                (pl.col("reason") if "reason" in deletes.columns else pl.lit(reason)).alias("reason"),
                pl.lit(phase).alias("phase"),
            )
            td = TableDiff(inserts=td.inserts, updates=td.updates, deletes=de)
        return cls({table: td})

    @classmethod
    def combine(cls, diffs: Iterable[Diff]) -> Diff:
        """Concatenate diffs in order and normalise (see module docstring)."""
        diffs = list(diffs)
        out: dict[str, TableDiff] = {}
        names = sorted({name for d in diffs for name in d.tables})
        for name in names:
            parts = {k: [getattr(d.tables[name], k) for d in diffs if name in d.tables] for k in KINDS}
            frames = {k: pl.concat([f for f in parts[k] if f.height], how="diagonal_relaxed") if any(f.height for f in parts[k]) else _empty(k) for k in KINDS}
            out[name] = _normalise(TableDiff(**frames))
        return cls(out)

    # -- reading ---------------------------------------------------------------------------
    @property
    def has_changes(self) -> bool:
        return any(td.has_changes for td in self.tables.values())

    def table(self, name: str) -> TableDiff:
        return self.tables.get(name, TableDiff())

    def row_counts(self) -> dict[str, dict[str, int]]:
        return {name: td.counts() for name, td in sorted(self.tables.items())}

    def content_hash(self) -> str:
        """sha256 of a canonical encoding: tables by name, kinds in :data:`KINDS` order, columns by
        name, rows by (phase, id), each column in :mod:`deep_sleep.core.canonical`'s byte format (its
        values, not its storage: an Int32 and an Int64 column of equal values hash alike).

        A column without a single value in the frame is left out: a null means "not changed" (or the
        store's default), so such a column says nothing — and a scope's rows read out of a shard's
        diff (:meth:`by_scope`), where other scopes' phases added columns, hash as a run of that scope
        alone."""
        h = hashlib.sha256(b"deep-sleep diff hash 2\n")
        for name, kind, canon in self._canonical_frames(reorder_columns=False):
            h.update(f"{name}.{kind}\n".encode())
            canonical.digest_frame(h, canon, sorted(c for c in canon.columns if canon.get_column(c).null_count() < canon.height))
        return h.hexdigest()

    def scope_hashes(self) -> dict[str, str]:
        """Every scope's :meth:`content_hash` in a shard's diff (scopes with rows): equal to
        ``{s: d.content_hash() for s, d in self.by_scope().items()}`` (:meth:`scope_hashes_plain`,
        tested against it), computed from each frame's canonical bytes encoded once for the whole
        shard and cut per scope — not one encoding (a few Polars calls per frame) per scope."""
        from deep_sleep.core.canonical import SlicedColumn

        per_scope: dict[str, list[bytes]] = {}
        for name in sorted(self.tables):
            for kind, frame in self.tables[name].frames().items():
                if not frame.height:
                    continue
                if "scope_path" not in frame.columns:
                    raise DiffError(f"{name}.{kind}: a shard's diff needs a scope_path on every row")
                frame = _by_scope_phase_and_id(frame)
                runs = frame.get_column("scope_path").rle()
                lengths = runs.struct.field("len").to_list()
                values = runs.struct.field("value").to_list()
                bounds = np.concatenate([[0], np.cumsum(lengths)])
                cols = sorted(c for c in frame.columns if not (c == "scope_path" and kind != "inserts"))
                streams = [stream for col in SlicedColumn.of_frame(frame, cols) for stream in col.run_streams(bounds)]
                title = [f"{name}.{kind}\n".encode()] * len(values)
                tail = [b"rows %d\n" % n for n in lengths]
                for scope, block in zip(values, map(b"".join, zip(title, *streams, tail)), strict=True):
                    per_scope.setdefault(scope, []).append(block)
        return {scope: hashlib.sha256(b"".join([b"deep-sleep diff hash 2\n", *parts])).hexdigest()
                for scope, parts in per_scope.items()}

    def scope_row_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """Every scope's :meth:`row_counts` in a shard's diff (scopes with rows), counted per frame at once."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for name in sorted(self.tables):
            for kind, frame in self.tables[name].frames().items():
                if not frame.height:
                    continue
                for scope, n in frame.group_by("scope_path").len().iter_rows():
                    out.setdefault(scope, {}).setdefault(name, dict.fromkeys(KINDS, 0))[kind] = n
        return out

    def scope_hashes_plain(self) -> dict[str, str]:
        """:meth:`scope_hashes` stated plainly: split by scope, hash each scope's diff."""
        return {s: d.content_hash() for s, d in self.by_scope().items()}

    def by_scope(self, only: Iterable[str] | None = None) -> dict[str, Diff]:
        """A shard's diff (every frame with a ``scope_path`` column) as one diff per scope: its rows
        alone, with the ``scope_path`` the shard added to updates and deletes taken off and the columns
        no row of the scope has a value in dropped — the diff a run of that scope alone gives.
        ``only``: just these scopes."""
        wanted = None if only is None else set(only)
        out: dict[str, dict[str, dict[str, pl.DataFrame]]] = {}
        for name, td in self.tables.items():
            for kind, frame in td.frames().items():
                if not frame.height:
                    continue
                if "scope_path" not in frame.columns:
                    raise DiffError(f"{name}.{kind}: a shard's diff needs a scope_path on every row")
                if wanted is not None:
                    frame = frame.filter(pl.col("scope_path").is_in(pl.Series(sorted(wanted), dtype=pl.String).implode()))
                for (scope,), part in frame.partition_by("scope_path", as_dict=True, maintain_order=True).items():
                    if kind != "inserts":
                        part = part.drop("scope_path")
                    keep = [c for c, n in zip(part.columns, part.null_count().row(0), strict=True) if n < part.height
                            or c in ("id", "expected_version", "phase")]
                    out.setdefault(scope, {}).setdefault(name, {})[kind] = part.select(keep) if len(keep) < part.width else part
        return {s: Diff({name: TableDiff(**kinds) for name, kinds in by_table.items()}) for s, by_table in out.items()}

    def ndjson_content_hash(self) -> str:
        """The content hash of releases before 2026-11-30 (sha256 of each frame as newline-delimited
        JSON).  Kept so a replay can still recognise the hash an older run recorded."""
        h = hashlib.sha256()
        for name, kind, canon in self._canonical_frames():
            h.update(f"{name}.{kind}\n".encode())
            buf = io.BytesIO()
            canon.write_ndjson(buf)
            h.update(buf.getbuffer())
        return h.hexdigest()

    def _canonical_frames(self, reorder_columns: bool = True) -> Iterator[tuple[str, str, pl.DataFrame]]:
        """Each non-empty frame with its rows by (phase, id) and (``reorder_columns``) its columns by name."""
        for name in sorted(self.tables):
            for kind, frame in self.tables[name].frames().items():
                if not frame.height:
                    continue
                canon = frame.select(sorted(frame.columns)) if reorder_columns else frame
                if not _in_canonical_order(canon):  # one phase's rows usually come sorted by id already
                    canon = _by_phase_and_id(canon)
                yield name, kind, canon

    # -- folding ---------------------------------------------------------------------------
    def fold(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot as it would look with this diff applied (what the next phase sees)."""
        changed = {}
        for name, td in self.tables.items():
            frame = snapshot.table(name)
            if td.deletes.height:
                frame = lookup.without(frame, td.deletes.get_column("id"))
            if td.updates.height:
                frame = _fold_updates(frame, td.updates)
            if td.inserts.height:
                new = tables.conform(name, td.inserts.drop("phase")).select(frame.columns)
                new = new.with_columns(pl.col("version").fill_null(0))
                frame = pl.concat([frame, new], how="vertical_relaxed")
            changed[name] = frame
        return snapshot.with_frames(changed)

    # -- files -----------------------------------------------------------------------------
    def write(self, directory: str | Path) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for kind in KINDS:
            for stale in out.glob(f"*.{kind}.parquet"):
                stale.unlink()
        for name, td in self.tables.items():
            for kind, frame in td.frames().items():
                if frame.height:
                    frame.write_parquet(out / f"{name}.{kind}.parquet", **tables.PARQUET_OPTIONS)
        return out

    @classmethod
    def read(cls, directory: str | Path, where: pl.Expr | None = None) -> Diff:
        """Read a diff directory; ``where``: only the rows it keeps (e.g. one scope of a shard's diff,
        read with Parquet's row-group statistics rather than whole)."""
        src = Path(directory)
        if not src.is_dir():
            raise DiffError(f"{src} is not a diff directory")
        found: dict[str, dict[str, pl.DataFrame]] = {}
        for file in sorted(p for kind in KINDS for p in src.glob(f"*.{kind}.parquet")):
            parts = file.name.split(".")
            if len(parts) != 3:
                raise DiffError(f"{file}: expected <table>.(inserts|updates|deletes).parquet")
            found.setdefault(parts[0], {})[parts[1]] = (pl.read_parquet(file) if where is None
                                                        else pl.scan_parquet(file).filter(where).collect())
        return cls({name: TableDiff(**kinds) for name, kinds in found.items()})


def _fold_updates(frame: pl.DataFrame, updates: pl.DataFrame, add_missing: bool = False) -> pl.DataFrame:
    if add_missing:  # e.g. a later phase sets valid_to on an edge inserted without one
        missing = [c for c in updates.columns if c not in ("id", "expected_version", "phase") and c not in frame.columns]
        frame = frame.with_columns(pl.lit(None, dtype=updates.schema[c]).alias(c) for c in missing)
    cols = [c for c in updates.columns if c not in ("id", "expected_version", "phase") and c in frame.columns]
    if not cols:
        return frame
    # Several phases may update one row: the last non-null value per column wins.
    latest = updates.select("id", *cols)
    if not lookup.unique(latest.get_column("id")):
        latest = latest.group_by("id", maintain_order=True).agg(pl.col(c).drop_nulls().last() for c in cols)
    latest = latest.with_columns(pl.col(c).cast(frame.schema[c]) for c in cols)
    # Write the new values in place of the old ones by row position: only the changed columns are
    # copied, the others stay shared with the previous view (a join would rebuild every column).
    found = lookup.matches(frame.get_column("id"), latest.get_column("id"))
    at = latest.drop("id")[found.get_column("_w")].with_columns(found.get_column("_pos"))
    flat = [c for c in cols if not frame.schema[c].is_nested()]
    out = []
    for c in flat:
        got = at.filter(pl.col(c).is_not_null())
        column = frame.get_column(c).clone()
        if got.height:
            column.scatter(got.get_column("_pos"), got.get_column(c))
        out.append(column)
    frame = frame.with_columns(out) if out else frame
    nested = [c for c in cols if c not in flat]
    if not nested:
        return frame
    joined = frame.join(latest.select("id", *nested), on="id", how="left", suffix="__new")
    return joined.with_columns(pl.coalesce(pl.col(f"{c}__new"), pl.col(c)).alias(c) for c in nested).select(frame.columns)


def _in_canonical_order(frame: pl.DataFrame) -> bool:
    """True when the rows are already ordered by (phase, id) — one phase's rows sorted by id."""
    return frame.get_column("phase").n_unique() == 1 and frame.get_column("id").is_sorted()


def _by_scope_phase_and_id(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame.sort("scope_path", "phase", "id", maintain_order=True)`` (:func:`_by_scope_phase_and_id_plain`),
    the order :meth:`Diff.scope_hashes` cuts a shard's frame in.  A frame of one scope (a big scope's
    night: 300k-row frames, whose three-string sort cost ~0.5 s each, most of the diff hash) is ordered
    by (phase, id) run by run as :func:`_by_phase_and_id` does, or left as it is when already in order;
    a frame of many scopes, or of fewer than :data:`SORT_ROWS` rows, is sorted plainly."""
    scope = frame.get_column("scope_path")
    if (frame.height < SORT_ROWS or scope.null_count() or frame.get_column("id").null_count()
            or not (scope == scope[0]).all()):
        return _by_scope_phase_and_id_plain(frame)
    return frame if _in_canonical_order(frame) else _by_phase_and_id(frame, stable=True)


def _by_scope_phase_and_id_plain(frame: pl.DataFrame) -> pl.DataFrame:
    """The order :func:`_by_scope_phase_and_id` gives, stated plainly: a stable sort by (scope_path, phase, id)."""
    return frame.sort("scope_path", "phase", "id", maintain_order=True)


def _by_phase_and_id(frame: pl.DataFrame, stable: bool = False) -> pl.DataFrame:
    """``frame.sort(["phase", "id"])``, without sorting strings where it can be avoided.

    A combined diff holds each phase's rows in one run (phases in roster order), so the order is
    each run's rows by id (:func:`lookup.text_order`: an integer sort of the ids' bytes), runs by
    phase name.  When a phase's rows are not one run, or an id is null or repeats within a run, the
    plain sort decides (its order among rows with equal keys is not defined anyway), as it does for
    frames under :data:`SORT_ROWS` rows, where it is the cheaper one.  ``stable``: that sort keeps
    rows of equal keys in their order (``maintain_order``), as the order built here does."""
    if frame.height < SORT_ROWS:
        return frame.sort(["phase", "id"], maintain_order=stable)
    runs = frame.get_column("phase").rle()
    lengths, phases = runs.struct.field("len").to_list(), runs.struct.field("value").to_list()
    all_ids = frame.get_column("id")
    if len(set(phases)) != len(phases) or None in phases or all_ids.null_count():
        return frame.sort(["phase", "id"], maintain_order=stable)
    starts = np.cumsum([0, *lengths[:-1]])
    order = []
    for start, length, _ in sorted(zip(starts, lengths, phases), key=lambda run: run[2]):
        ids = all_ids.slice(int(start), length)
        if not lookup.unique(ids):
            return frame.sort(["phase", "id"], maintain_order=stable)
        order.append(start + (np.arange(length) if ids.is_sorted() else lookup.text_order(ids)))
    return frame[np.concatenate(order)]


def _normalise(td: TableDiff) -> TableDiff:
    """See :meth:`Diff.combine`.  Rows with a null id are dropped wherever they are tested against
    other rows' ids (as ``is_in`` filters drop them); the validation rejects them anyway."""
    inserts, updates, deletes = td.inserts, td.updates, td.deletes
    if deletes.height and not inserts.height and not updates.height:  # only deletes (a nap's events): nothing to net
        ids = deletes.get_column("id")
        return TableDiff(inserts=inserts, updates=updates, deletes=deletes.filter(ids.is_not_null()) if ids.null_count() else deletes)
    if deletes.height:
        deleted = deletes.get_column("id")
        # Few rows of a run are inserted or updated and then deleted: probe hashes first.
        gone = lookup.member(inserts.get_column("id"), deleted, few=True)
        inserted_then_deleted = inserts.get_column("id").filter(gone)
        inserts = inserts.filter(_kept(inserts, gone))
        updates = updates.filter(_kept(updates, lookup.member(updates.get_column("id"), deleted, few=True)))
        deletes = deletes.filter(_kept(deletes, lookup.member(deleted, inserted_then_deleted, few=True)))
    if inserts.height and updates.height:
        on = lookup.member(updates.get_column("id"), inserts.get_column("id"), few=True)
        if on.any():
            phase = inserts.get_column("phase")
            inserts = _fold_updates(inserts.drop("phase"), updates.filter(on), add_missing=True).with_columns(phase)
            updates = updates.filter(_kept(updates, on))
    return TableDiff(inserts=inserts, updates=updates, deletes=deletes)


def _kept(frame: pl.DataFrame, matched: pl.Series) -> pl.Series:
    return ~matched & frame.get_column("id").is_not_null()
