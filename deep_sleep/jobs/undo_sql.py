"""The undo's SQL, as pure functions of a table (and the columns a run changed).

Each statement reverts one kind of change in one table, guarded so that a row changed since the
run is left alone, and marks every reverted row in the temporary table :data:`DONE`;
:func:`not_restored_sql` then lists the changes left as they are, with the reason.  Parameters
are positional (``$1`` …), as ADBC takes them.
"""

from __future__ import annotations

from deep_sleep.core import tables

AFTER = "__after"  # suffix of the staged columns holding what the run wrote
CLEAR = "_ds_clear"  # staged flag: the run wrote a vector on this row (cleared by the restore)
DONE = "_ds_undo_done"  # temp table: (table_name, kind, id) of every reverted row

GONE = "deleted since the run's snapshot"
NOT_THERE = "not in the store (the apply skipped it as a conflict, or it was deleted since)"
CHANGED = "changed since the run"
NOT_WRITTEN_UPDATE = "not written by this run (a live write came first; the apply skipped it as a conflict)"
NOT_WRITTEN_INSERT = "not written by this run (the id was already taken when the run applied)"
NO_BEFORE_IMAGE = "no before-image in the run's snapshot"
ID_EXISTS = "a row with this id exists again"
KEY_EXISTS = "a row with the same natural key exists"
ENDPOINT_GONE = "its source or target node is not in the store (deleted since the run): the edge would dangle"
CLUSTER_FULL = ("its META node has its cap of CLUSTERS edges (meta_nodes.max_members) without it: members added since"
                " the run, or by it and changed since, took its place")
HAS_EDGES = "an edge of the store still touches it (added or changed since the run): removing it would leave the edge dangling"

# The graph stays whole through an undo (issue 31): a node the run inserted goes only when no edge
# touches it any more (the run's own inserted edges are removed first), and an edge the run deleted
# comes back only when both of its nodes are in the store (nodes are re-inserted first), each taken
# FOR KEY SHARE as the apply's edge inserts take them (issue 37): a live delete of the node cannot
# commit between the probe and the re-insert.
_NODE_FREE = ("NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.source_id = t.id)"
              " AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.target_id = t.id)")
_ENDPOINTS = ("EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = {r}.source_id AND n.scope_path = {r}.scope_path{lock})"
              " AND EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = {r}.target_id AND n.scope_path = {r}.scope_path{lock})")
_KEY_SHARE = " FOR KEY SHARE"


def stage_name(table: str, kind: str) -> str:
    return f"_ds_undo_{table}_{kind}"


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _same(table: str, column: str, staged: str) -> str:
    return f"t.{column} IS NOT DISTINCT FROM {tables.columns(table)[column].cast_sql('s.' + staged)}"


def _mark(table: str, kind: str, ids: str) -> str:
    return (f" marked AS (INSERT INTO {DONE} (table_name, kind, id) SELECT '{table}', '{kind}', {ids} RETURNING 1)"
            f" SELECT count(*) AS n FROM marked")


def remove_inserts_sql(table: str, present: list[str]) -> str:
    """Delete the rows the run inserted that are unchanged (version 1, the inserted values) and archive
    them under the undo's run id.  Parameters: $1 scope_path, $2 undo run id, $3 archive reason."""
    guards = " AND ".join(["t.version = 1", *(_same(table, c, c) for c in present if c not in ("id", "version")),
                           *([_NODE_FREE] if table == "memory_nodes" else [])])
    return (
        f"WITH gone AS (DELETE FROM {table} t USING {stage_name(table, 'inserts')} s"
        f" WHERE t.id = s.id::uuid AND t.scope_path = $1 AND {guards} RETURNING t.*),"
        f" archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row)"
        f" SELECT $2::uuid, '{table}', gone.id::text, 'undo', $3, to_jsonb(gone) FROM gone RETURNING row_id),"
        + _mark(table, "inserts", "row_id FROM archived")
    )


def restore_updates_sql(table: str, changed: list[str], unchanged: list[str], cleared: list[str] = ()) -> str:
    """Put the snapshot's values of ``changed`` back on rows the run updated and nobody touched since:
    version = snapshot + 1, ``changed`` hold what the run wrote, ``unchanged`` hold the snapshot's
    values.  ``cleared``: columns a snapshot does not carry (a node's vector) that the run wrote on the
    rows staged with :data:`CLEAR`: set to null there (their before-image is unknown).  Parameters: $1 scope_path."""
    cols = tables.columns(table)
    sets = ", ".join([*(f"{c} = {cols[c].cast_sql('s.' + c)}" for c in changed),
                      *(f"{c} = CASE WHEN s.{CLEAR} THEN NULL ELSE t.{c} END" for c in cleared)])
    guards = " AND ".join(["t.version = s.expected_version + 1", *(_same(table, c, c + AFTER) for c in changed),
                           *(_same(table, c, c) for c in unchanged)])
    return (
        f"WITH done AS (UPDATE {table} t SET {sets} FROM {stage_name(table, 'updates')} s"
        f" WHERE t.id = s.id::uuid AND t.scope_path = $1 AND {guards} RETURNING t.id),"
        + _mark(table, "updates", "id::text FROM done")
    )


def _clusters(scope: str, source: str) -> str:
    """The store's CLUSTERS edges of a META node, counted (SQL)."""
    return (f"(SELECT count(*) FROM memory_edges e WHERE e.scope_path = {scope} AND e.source_id = {source}"
            " AND e.relation = 'CLUSTERS')")


def reinsert_deletes_sql(table: str, cluster_cap: int | None = None) -> str:
    """Re-insert the run's archived rows of ``table`` whose id and natural keys are free (an edge: and
    both of its nodes are in the store).  ``cluster_cap`` (edges): a META node's ``CLUSTERS`` edges come
    back only while it keeps at most this many (``meta_nodes.max_members``) — the run deleted them to
    make room for members it added, and one of those may still be there, or a later run's.
    Parameters: $1 scope_path, $2 the undone run id."""
    src = (f"WITH src AS (SELECT a.row FROM consolidation_archive a WHERE a.run_id = $2::uuid"
           f" AND a.table_name = '{table}' AND a.op = 'delete' AND a.row->>'scope_path' = $1),")
    if table == "memory_edges" and cluster_cap is not None:
        return (
            src + f" cand AS (SELECT r FROM src, LATERAL jsonb_populate_record(NULL::{table}, src.row) r"
            f" WHERE NOT EXISTS (SELECT 1 FROM {table} x WHERE x.id = r.id) AND {_ENDPOINTS.format(r='r', lock=_KEY_SHARE)}),"
            " ranked AS (SELECT c.r, CASE WHEN (c.r).relation = 'CLUSTERS' THEN row_number() OVER"
            " (PARTITION BY (c.r).relation, (c.r).source_id ORDER BY (c.r).id) END AS k FROM cand c),"
            f" ins AS (INSERT INTO {table} OVERRIDING SYSTEM VALUE SELECT (q.r).* FROM ranked q WHERE q.k IS NULL"
            f" OR q.k + {_clusters('(q.r).scope_path', '(q.r).source_id')} <= {int(cluster_cap)}"
            " ON CONFLICT DO NOTHING RETURNING id),"
            + _mark(table, "deletes", "id::text FROM ins")
        )
    # A folded event (phase 10) comes back to the hot table and leaves episodic_folded in the same statement.
    unfold = (" unfolded AS (DELETE FROM episodic_folded f USING ins WHERE f.id = ins.id AND f.run_id = $2::uuid),"
              if table == "episodic_events" else "")
    return (
        src + f" ins AS (INSERT INTO {table} OVERRIDING SYSTEM VALUE SELECT r.* FROM src,"
        f" LATERAL jsonb_populate_record(NULL::{table}, src.row) r"
        f" WHERE NOT EXISTS (SELECT 1 FROM {table} x WHERE x.id = r.id)"
        + (" AND " + _ENDPOINTS.format(r="r", lock=_KEY_SHARE) if table == "memory_edges" else "")
        + " ON CONFLICT DO NOTHING RETURNING id),"
        + unfold
        + _mark(table, "deletes", "id::text FROM ins")
    )


def not_restored_sql(table: str, kind: str, cluster_cap: int | None = None) -> str:
    """The changes of ``kind`` in ``table`` left as they are, with the reason.  $1 scope_path[, $2 run id]."""
    skipped = f"NOT EXISTS (SELECT 1 FROM {DONE} d WHERE d.table_name = '{table}' AND d.kind = '{kind}' AND d.id = {{id}})"
    if kind == "deletes":
        endpoint = ""
        if table == "memory_edges":
            gone = _ENDPOINTS.replace("{r}.source_id", "(a.row->>'source_id')::uuid").replace(
                "{r}.target_id", "(a.row->>'target_id')::uuid").replace("{r}.scope_path", "(a.row->>'scope_path')").replace("{lock}", "")
            endpoint = f" WHEN x.id IS NULL AND NOT ({gone}) THEN {_lit(ENDPOINT_GONE)}"
            if cluster_cap is not None:
                full = _clusters("(a.row->>'scope_path')", "(a.row->>'source_id')::uuid")
                endpoint += (f" WHEN x.id IS NULL AND a.row->>'relation' = 'CLUSTERS' AND {full} >= {int(cluster_cap)}"
                             f" THEN {_lit(CLUSTER_FULL)}")
        return (
            f"SELECT a.row_id AS id, CASE WHEN x.id IS NOT NULL THEN {_lit(ID_EXISTS)}{endpoint} ELSE {_lit(KEY_EXISTS)} END AS reason,"
            f" x.version AS live_version FROM consolidation_archive a LEFT JOIN {table} x ON x.id = (a.row->>'id')::uuid"
            f" WHERE a.run_id = $2::uuid AND a.table_name = '{table}' AND a.op = 'delete' AND a.row->>'scope_path' = $1"
            f" AND {skipped.format(id='a.row_id')} ORDER BY a.row_id"
        )
    expected = "s.expected_version + 1" if kind == "updates" else "1"
    not_written = NOT_WRITTEN_UPDATE if kind == "updates" else NOT_WRITTEN_INSERT
    gone = GONE if kind == "updates" else NOT_THERE
    edges = f" WHEN NOT ({_NODE_FREE}) THEN {_lit(HAS_EDGES)}" if kind == "inserts" and table == "memory_nodes" else ""
    return (
        f"SELECT s.id, CASE WHEN t.id IS NULL THEN {_lit(gone)} WHEN t.version <> {expected} THEN {_lit(CHANGED)}{edges}"
        f" ELSE {_lit(not_written)} END AS reason, t.version AS live_version"
        f" FROM {stage_name(table, kind)} s LEFT JOIN {table} t ON t.id = s.id::uuid AND t.scope_path = $1"
        f" WHERE {skipped.format(id='s.id')} ORDER BY s.id"
    )


UNDONE_SQL = "UPDATE consolidation_runs SET status = 'undone' WHERE run_id = $1::uuid AND status = 'applied'"
UNDO_LEDGER_SQL = (
    "INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status,"
    " rows_changed, conflicts, undo_of, not_restored)"
    " VALUES ($1::uuid, $2, 'undo', $3, $3, now(), 'applied', $4::jsonb, $5, $6::uuid, $7::jsonb)"
)
