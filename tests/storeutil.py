"""Small helpers for tests: write rows straight into the real store and read a scope back."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta

from deep_sleep.core import tables
from deep_sleep.core.scope import Scope
from deep_sleep.store.db import Store, create_database, drop_database  # noqa: F401 - re-exported for tests

SCOPED_TABLES = tuple(tables.TABLES) + ("consolidation_archive",)


def insert(store: Store, table: str, rows: list[dict]) -> None:
    """Insert rows (dicts); rows with different key sets are inserted as separate batches."""
    shapes: dict[tuple, list[dict]] = {}
    for row in rows:
        shapes.setdefault(tuple(row), []).append(row)
    for batch in shapes.values():
        _insert(store, table, batch)


def _insert(store: Store, table: str, rows: list[dict]) -> None:
    cols = list(rows[0])
    spec = tables.columns(table)
    pg_type = {"json": "jsonb", "uuid": "uuid", "text": "text", "ts": "timestamptz", "float": "float8",
               "floats": "float8[]", "int": "bigint"}
    casts = ", ".join(f"%s::{pg_type[spec[c].kind]}" if c in spec else "%s" for c in cols)
    sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({casts})"
    with store.pg() as con:
        con.cursor().executemany(sql, [[json.dumps(r[c]) if c in spec and spec[c].kind == "json" and not isinstance(r[c], str) and r[c] is not None else r[c] for c in cols] for r in rows])
        con.commit()


def node(scope: Scope, label: str, updated_at: datetime, *, layer: str = "semantic", importance: float = 5.0,
         properties: dict | None = None, id: str | None = None) -> dict:
    return {
        "id": id or str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "layer": layer,
        "label": label, "properties": properties or {}, "importance": importance,
        "created_at": updated_at - timedelta(days=1), "updated_at": updated_at,
    }


def access(scope: Scope, node_id: str, at: datetime) -> dict:
    return {"scope_path": scope.path, "tenant_id": scope.tenant_id, "node_id": node_id, "accessed_at": at}


def edge(scope: Scope, source: str, target: str, relation: str = "RELATED_TO", at: datetime | None = None) -> dict:
    row = {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id,
           "source_id": source, "target_id": target, "relation": relation}
    if at is not None:
        row["created_at"] = at
        row["updated_at"] = at
    return row


def small_graph(store: Store, scope: Scope, now: datetime) -> dict[str, list[str]]:
    """Three semantic nodes read twice in the last hour, one read once, one working node whose
    TTL has run out (with an edge), one working node still alive."""
    hot = [node(scope, f"project: hot {i}", now - timedelta(hours=3)) for i in range(3)]
    cold = node(scope, "project: cold", now - timedelta(hours=3))
    expired = node(scope, "note: scratch", now - timedelta(hours=2), layer="working", properties={"ttl_hours": 1})
    alive = node(scope, "note: fresh", now - timedelta(minutes=10), layer="working", properties={"ttl_hours": 24})
    insert(store, "memory_nodes", [*hot, cold, expired, alive])
    insert(store, "memory_access_log", [access(scope, n["id"], now - timedelta(minutes=m)) for n in hot for m in (5, 30)]
           + [access(scope, cold["id"], now - timedelta(minutes=5))])
    insert(store, "memory_edges", [edge(scope, hot[0]["id"], expired["id"], at=now - timedelta(hours=3))])
    return {"hot": [n["id"] for n in hot], "cold": [cold["id"]], "expired": [expired["id"]], "alive": [alive["id"]]}


def dump(store: Store, scope: Scope) -> dict[str, list]:
    """Every row of the scope in every table (and its runs and archive), in a stable order."""
    out = {}
    with store.pg() as con:
        for table in tables.TABLES:
            out[table] = [r[0] for r in con.execute(
                f"SELECT to_jsonb(t)::text FROM {table} t WHERE scope_path = %s ORDER BY 1", (scope.path,))]
        out["consolidation_runs"] = [r[0] for r in con.execute(
            "SELECT run_id::text FROM consolidation_runs WHERE scope_path = %s ORDER BY 1", (scope.path,))]
        out["consolidation_archive"] = [r[0] for r in con.execute(
            "SELECT a.row::text FROM consolidation_archive a JOIN consolidation_runs r USING (run_id) WHERE r.scope_path = %s ORDER BY 1",
            (scope.path,))]
    return out


def scalar(store: Store, sql: str, *params):
    with store.pg() as con:
        return con.execute(sql, params).fetchone()[0]



def embed_labels(store: Store, scope: Scope) -> None:
    """Give every node of the scope the live embedder's vector of its label (as record_turn writes it),
    so the recall-quality gate can rank them."""
    from deep_sleep.core.embedding import default_embedder

    embedder = default_embedder()
    with store.pg() as con:
        rows = con.execute("SELECT id::text, label FROM memory_nodes WHERE scope_path = %s ORDER BY id", (scope.path,)).fetchall()
        if rows:
            vectors = embedder.embed([label for _, label in rows])
            con.cursor().executemany(
                "UPDATE memory_nodes SET embedding = %s::vector, embedding_model = %s WHERE id = %s::uuid",
                [("[" + ",".join(f"{x:.7f}" for x in v) + "]", embedder.name, i) for (i, _), v in zip(rows, vectors, strict=True)])
        con.commit()


def used(scope: Scope, node_id: str, query: str, at: datetime) -> dict:
    """A recall_events row: the agent used ``node_id`` for ``query`` (explicit positive feedback)."""
    return {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "query": query,
            "node_id": node_id, "similarity": 0.9, "score": 0.8, "features": [0.0] * 12, "label": 1.0,
            "label_source": "explicit", "created_at": at}


def word_of(n: int) -> str:
    """A word of letters only, one per ``n`` (``kwa``, ``kwb``, …): a term no other turn or row holds."""
    out = ""
    while True:
        n, d = divmod(n, 26)
        out = chr(97 + d) + out
        if not n:
            return "kw" + out
