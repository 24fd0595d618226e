"""Recording a live turn (SPEC §5): :func:`record_turn` files a turn's operations in one short
transaction, and every ``quick_nap_interval``-th turn of a scope naps.

    >>> receipt = record_turn(store, scope, [{"op": "upsert_node", "label": "user: Ada", "properties": {"api_key": "sk-1"}}])  # doctest: +SKIP
    >>> receipt.landed[0].action, receipt.redacted                           # doctest: +SKIP
    ('inserted', ('ops[0].properties.api_key',))

Each operation is checked on its own (:mod:`deep_sleep.online.ops`: the ops, their fields, the
limits and the redaction of credentials); a malformed one is rejected by index and name with the
reason, and the valid ones of the same turn still land — whatever an op holds, it is rejected by
its checks or it lands, it never fails the write.  A turn creates rows in its scope, so a scope
whose kinds or ids look like something else (:attr:`Scope.lookalikes`: a Cyrillic letter in a Latin
id, a bidi override) is refused with a ScopeError showing the code points, even if the store already
holds it (its rows stay readable; see :mod:`deep_sleep.core.scope`).

The turn's episodic record is its own events when it creates some; a turn that creates none writes
one episodic event summarising it (``metadata.kind = "turn_summary"``, counts and labels only: it
repeats no event text, so phase 12 does not count an action twice) — never a filler event beside
real ones.  It writes one ``memory_access_log`` row per node it wrote (``write``) or only read
(``read``).  Every vector is the configured embedder's (``embedding.model``), and records it
(``embedding_model``).
Upserts add 1 to ``access_count``; new nodes start at 1.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import psycopg

from deep_sleep.core.characters import without_hidden
from deep_sleep.core.config import EmbeddingConfig
from deep_sleep.core.embedding import EmbeddingProvider, as_provider, embedder_for, given, node_text
from deep_sleep.core.errors import InputError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.online.credentials import redact_text
from deep_sleep.online.errors import (
    OnlineArgumentError,
    OnlineArgumentTypeError,
    OpRejected,
)
from deep_sleep.online.nap import default_config, quick_nap
from deep_sleep.online.ops import (
    CONTROL,
    MAX_INDEXED_BYTES,
    MAX_OPS_PER_TURN,
    Op,
    check_label,
    check_op,
    check_text,
    op_name,
)
from deep_sleep.online.pg import (
    connection,
    dumps,
    pipelined_transaction,
    vector_text,
    visible,
)
from deep_sleep.store.db import Store
from deep_sleep.store.vectors import CLAIM_MODEL_SQL, STORE_MODEL_SQL, model_conflict
from deep_sleep.transforms import new_report
from deep_sleep.transforms.config import ConsolidationConfig

log = logging.getLogger(__name__)

__all__ = ["Landed", "Receipt", "Rejected", "record_turn"]

WORKING_TTL_HOURS = 24
# A turn's scope_path leaves room for a thought's label ("thought: " and 80 characters) in MAX_INDEXED_BYTES.
MAX_SCOPE_PATH_BYTES = 2048
NEW_IMPORTANCE = 5.0


@dataclass(frozen=True)
class Landed:
    """An operation that was stored: its index in the turn, its name, the row id and what happened
    (``inserted``, ``updated``, ``existing`` for a skill already filed, ``logged`` for a read)."""

    index: int
    op: str
    id: str
    action: str


@dataclass(frozen=True)
class Rejected:
    """An operation that was not stored, and why (the reason names the field and the rule)."""

    index: int
    op: str
    reason: str


@dataclass(frozen=True)
class Receipt:
    """What one turn did.

    scope_path, turn: the scope and the turn's number in it (1-based).
    landed / rejected: every operation, in turn order, in exactly one of the two.
    redacted: paths of what was redacted: credential-looking keys whose values were replaced
        (``ops[2].properties.api_key``) and strings that held secrets of well-known formats (``ops[1].content``, ``summary``).
    summary_event_id: the turn's episodic record: its summary event, or its first own event.
    quick_nap: the report of the quick nap this turn triggered, if any (``status`` ``applied`` or ``failed``).
    notes: things worth knowing that are not rejections (a skill asked to be ``active`` was filed as draft).
    """

    scope_path: str
    turn: int
    landed: tuple[Landed, ...]
    rejected: tuple[Rejected, ...]
    redacted: tuple[str, ...]
    summary_event_id: str
    quick_nap: ConsolidationReport | None = None
    notes: tuple[str, ...] = ()

    def ids(self, op: str | None = None) -> list[str]:
        return [x.id for x in self.landed if op is None or x.op == op]


_TURN_SQL = (
    "INSERT INTO scope_turns AS t (scope_path, tenant_id, turns, last_turn_at) VALUES (%s, %s, 1, %s)"
    " ON CONFLICT (scope_path) DO UPDATE SET turns = t.turns + 1, last_turn_at = EXCLUDED.last_turn_at RETURNING turns"
)
# The node an upsert updates: per (layer, label) the first by importance, recency, id.  Only that
# row is fetched and locked — a label may be shared by many nodes of a scope (tens in the benchmark's
# seed, up to ~2000), and locking them all dirtied every one of their pages for nothing.
_EXISTING_SQL = (
    "SELECT id::text, layer, label, properties FROM memory_nodes WHERE id IN ("
    "SELECT DISTINCT ON (layer, label) id FROM memory_nodes"
    " WHERE scope_path = %s AND label = ANY(%s) AND layer = ANY(%s)"
    " ORDER BY layer, label, importance DESC, updated_at DESC, id::text)"  # id::text: the tie order the outer query used
    " ORDER BY layer, label, importance DESC, updated_at DESC, id FOR UPDATE"
)
# Multi-row statements ({rows} = one VALUES tuple per row): in pipeline mode they queue without a
# sync, so all of a turn's writes and its COMMIT travel in one round trip.
_UPDATE_NODES_SQL = (
    "UPDATE memory_nodes AS n SET properties = v.properties, importance = COALESCE(v.importance, n.importance),"
    " embedding = v.embedding, embedding_model = v.embedding_model, updated_at = v.updated_at,"
    " access_count = n.access_count + 1"
    " FROM (VALUES {rows}) AS v(properties, importance, embedding, embedding_model, updated_at, id) WHERE n.id = v.id"
)
_UPDATE_NODE_ROW = "(%s::jsonb, %s::float8, %s::vector, %s, %s::timestamptz, %s::uuid)"
_INSERT_NODES_SQL = (
    "INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, access_count, embedding,"
    " embedding_model, created_at, updated_at) VALUES {rows}"
)
_INSERT_NODE_ROW = "(%s::uuid, %s, %s, %s, %s, %s::jsonb, %s, 1, %s::vector, %s, %s, %s)"
_INSERT_EVENTS_SQL = (
    "INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, metadata, embedding, embedding_model,"
    " created_at) VALUES {rows}"
)
_INSERT_EVENT_ROW = "(%s::uuid, %s, %s, %s, %s, %s::jsonb, %s::vector, %s, %s)"
_INSERT_TRIGGERS_SQL = (
    "INSERT INTO prospective_triggers (id, scope_path, tenant_id, condition, action, due_at, status, created_at, updated_at)"
    " VALUES {rows}"
)
_INSERT_TRIGGER_ROW = "(%s::uuid, %s, %s, %s, %s, %s, 'pending', %s, %s)"
_ACCESS_SQL = "INSERT INTO memory_access_log (scope_path, tenant_id, node_id, accessed_at, kind) VALUES {rows}"
_ACCESS_ROW = "(%s, %s, %s::uuid, %s, %s)"


def _write_rows(cur: psycopg.Cursor, sql: str, row: str, rows: list[tuple]) -> None:
    if rows:
        cur.execute(sql.format(rows=", ".join([row] * len(rows))), [value for r in rows for value in r])


_SKILL_SQL = (
    "WITH found AS (SELECT id FROM procedural_skills WHERE scope_path = %(scope)s AND lower(name) = lower(%(name)s)"
    " ORDER BY created_at, id LIMIT 1),"
    " ins AS (INSERT INTO procedural_skills (id, scope_path, tenant_id, name, description, steps, status, source, embedding,"
    " embedding_model, created_at, updated_at) SELECT %(id)s::uuid, %(scope)s, %(tenant)s, %(name)s, %(description)s,"
    " %(steps)s::jsonb, 'draft', 'online', %(embedding)s::vector, %(model)s, %(now)s, %(now)s"
    " WHERE NOT EXISTS (SELECT 1 FROM found) RETURNING id)"
    " SELECT id::text, true FROM ins UNION ALL SELECT id::text, false FROM found"
)


def _node_text(label: str, properties: dict) -> str:
    return node_text(label, properties)


def _short(text: str, n: int = 60) -> str:
    """One line of at most ``n`` characters that a label may hold (a thought's label is made from its
    text, which may hold line breaks and invisible characters a label must not)."""
    text = without_hidden(CONTROL.sub(" ", text)).strip()
    return text if len(text) <= n else text[: n - 1] + "…"


def record_turn(
    store_or_conn: Store | psycopg.Connection,
    scope: Scope | str,
    ops: Sequence[Any] | None,
    *,
    now: datetime | None = None,
    session_id: str | None = None,
    thinking: Sequence[str] = (),
    summary: str | None = None,
    config: ConsolidationConfig | None = None,
    embedder: EmbeddingProvider | None = None,
    nap: bool = True,
    durable: bool = True,
) -> Receipt:
    """File one live turn's operations in one transaction and return the :class:`Receipt`.

    ``thinking`` notes are filed like ``thinking`` ops; ``summary`` replaces the generated turn
    summary text; ``now`` (default: the wall clock) stamps every row.  When the turn is the
    scope's ``quick_nap_interval``-th, a quick nap runs after the commit (unless ``nap`` is
    false); its report is on the receipt.  A nap that fails does not fail the turn.
    ``durable=False`` commits without waiting for the WAL flush (``synchronous_commit = off``
    for this transaction: ~4 ms less per turn on this disk, and a server crash may lose the
    last fraction of a second of turns — never half a turn).
    """
    scope = Scope.coerce(scope).check_new()
    path_bytes = len(scope.path.encode())
    if path_bytes > MAX_SCOPE_PATH_BYTES:
        raise OnlineArgumentError(f"record_turn: scope {scope} is {path_bytes} bytes of UTF-8 as a scope_path; a turn's "
                                  f"scope may have at most {MAX_SCOPE_PATH_BYTES} (PostgreSQL indexes it with a label, "
                                  f"at most {MAX_INDEXED_BYTES} bytes together): use fewer or shorter levels")
    config = config or default_config()
    nap_config = config
    try:
        if embedder is None:
            embedder = embedder_for(config)
        else:  # the nap embeds as the turn did: its configuration names this very provider
            embedder = as_provider(embedder, "embedder")
            nap_config = config.model_copy(update={"embedding": EmbeddingConfig(model=given(embedder))})
    except InputError as exc:
        raise OnlineArgumentError(f"record_turn: {exc}") from None
    try:
        now = utc(now or datetime.now(UTC))
    except OverflowError:
        raise OnlineArgumentError(f"record_turn: now={now!r} is outside years 1–9999 once converted to UTC") from None
    if ops is None:
        ops = []
    if isinstance(ops, (str, bytes, dict)) or not isinstance(ops, Sequence):
        raise OnlineArgumentTypeError(f"record_turn: ops must be a list of operations, got {type(ops).__name__}")
    ops = list(ops) + [{"op": "thinking", "text": t} for t in thinking]
    if session_id is not None:
        try:
            session_id = check_label(session_id, "session_id")
        except OpRejected as exc:
            raise OnlineArgumentError(f"record_turn: {exc}") from None
    redacted: list[str] = []
    if summary is not None:
        try:
            summary, secrets = redact_text(check_text(summary, "summary"))
        except OpRejected as exc:
            raise OnlineArgumentError(f"record_turn: {exc}") from None
        if secrets:
            redacted.append("summary")

    rejected: list[Rejected] = []
    accepted: list[tuple[int, str, Op]] = []
    for i, raw in enumerate(ops):
        if i >= MAX_OPS_PER_TURN:
            rejected.append(Rejected(i, op_name(raw), f"the turn carries {len(ops)} operations; the limit is {MAX_OPS_PER_TURN}"))
            continue
        try:
            op, paths = check_op(i, raw, max_label_chars=config.quarantine.max_label_chars,
                                 max_label_bytes=MAX_INDEXED_BYTES - path_bytes)
        except OpRejected as exc:
            rejected.append(Rejected(i, op_name(raw), str(exc)))
            continue
        accepted.append((i, op.op, op))
        redacted += paths

    path, tenant = scope.path, scope.tenant_id
    landed: list[Landed] = []
    notes: list[str] = []
    # upserts: fold repeats of one (layer, label) in turn order, then update or insert
    upserts: dict[tuple[str, str], dict] = {}
    for i, name, f in accepted:
        if name == "upsert_node":
            slot = upserts.setdefault((f.layer, f.label), {"indexes": [], "properties": {}, "importance": None})
            slot["indexes"].append(i)
            slot["properties"].update(f.properties)
            if f.importance is not None:
                slot["importance"] = f.importance
    reads = [(i, f.id) for i, name, f in accepted if name == "read_node"]

    # Pipeline mode: BEGIN and the three reads go in one round trip, the writes and COMMIT in one more.
    with connection(store_or_conn) as conn, pipelined_transaction(conn):
        cur, found_cur, read_cur, model_cur = conn.cursor(), conn.cursor(), conn.cursor(), conn.cursor()
        if not durable:  # a cursor of its own: in a pipeline, a cursor's result is its last statement's, not its first's
            conn.execute("SET LOCAL synchronous_commit = off")
        model_cur.execute(STORE_MODEL_SQL, (tenant,))
        cur.execute(_TURN_SQL, (path, tenant, now))
        if upserts:
            found_cur.execute(_EXISTING_SQL, (path, sorted({k[1] for k in upserts}), sorted({k[0] for k in upserts})))
        if reads:
            sql = f"SELECT id::text, scope_path FROM memory_nodes n WHERE n.id = ANY(%(ids)s::uuid[]) AND {visible('n', scope.levels[0][0] == 'tenant')}"
            read_cur.execute(sql, {"ids": [r[1] for r in reads], "paths": scope.ancestor_paths(), "tenant": tenant})
        turn = cur.fetchone()[0]
        stored = model_cur.fetchone()
        if stored is None:  # the tenant's first vectors: this turn's model becomes the tenant's (of two at once, one wins)
            model_cur.execute(CLAIM_MODEL_SQL, (tenant, embedder.name))
            stored = model_cur.execute(STORE_MODEL_SQL, (tenant,)).fetchone()
        if stored[0] != embedder.name:  # raised inside the transaction: it rolls back, nothing of the turn is stored
            raise model_conflict(stored[0], embedder.name, "record_turn", tenant)
        existing: dict[tuple[str, str], tuple[str, dict]] = {}
        for nid, layer, label, props in found_cur.fetchall() if upserts else ():
            existing.setdefault((layer, label), (nid, props if isinstance(props, dict) else {}))
        readable: dict[str, str | None] = dict(read_cur.fetchall()) if reads else {}

        # texts to embed, in one call
        texts: list[str] = []
        node_rows: dict[tuple[str, str], dict] = {}
        for key, slot in upserts.items():
            layer, label = key
            found = existing.get(key)
            props = {**(found[1] if found else {}), **slot["properties"]}
            if layer == "working":
                props.setdefault("ttl_hours", WORKING_TTL_HOURS)
            node_rows[key] = {"id": found[0] if found else str(uuid.uuid4()), "action": "updated" if found else "inserted",
                              "properties": props, "slot": slot, "text": len(texts)}
            texts.append(_node_text(label, props))
        plan_rows: list[tuple[int, str, Op, int]] = []
        for i, name, f in accepted:
            if name == "create_event":
                plan_rows.append((i, name, f, len(texts)))
                texts.append(f.content)
            elif name == "thinking":
                plan_rows.append((i, name, f, len(texts)))
                texts.append(f.text)
            elif name == "register_skill":
                plan_rows.append((i, name, f, len(texts)))
                texts.append(f"{f.name} {f.description}")
            elif name in ("set_trigger", "read_node"):
                plan_rows.append((i, name, f, -1))

        # what lands, in turn order
        for key, row in node_rows.items():
            for i in row["slot"]["indexes"]:
                landed.append(Landed(i, "upsert_node", row["id"], row["action"]))
        for i, name, f, _ in plan_rows:
            if name == "read_node":
                if f.id in readable:
                    landed.append(Landed(i, name, f.id, "logged"))
                else:
                    rejected.append(Rejected(i, name, f"node {f.id} does not exist or is not visible from scope {scope}"))
        # The turn's episodic record: its own events when it has them, else one summary event (counts and
        # labels only) — never a filler event beside real ones (it doubled the events and half of each
        # episodic summary's text was "turn 12: 1 node(s) written").  A ``summary`` given is always written.
        own_events = any(r[1] == "create_event" for r in plan_rows)
        summary_text = summary or (None if own_events else _turn_summary(turn, node_rows, plan_rows, readable, len(rejected)))
        if summary_text is not None:
            texts.append(summary_text)
        vectors = embedder.embed(texts)
        model = embedder.name
        vec = lambda t: vector_text(vectors[t])  # noqa: E731
        with_model = lambda t: model if vec(t) is not None else None  # noqa: E731

        # write
        node_updates, node_inserts = [], []
        for (layer, label), row in node_rows.items():
            props, t = dumps(row["properties"]), row["text"]
            if row["action"] == "updated":
                node_updates.append((props, row["slot"]["importance"], vec(t), with_model(t), now, row["id"]))
            else:
                imp = row["slot"]["importance"] or NEW_IMPORTANCE
                node_inserts.append((row["id"], path, tenant, layer, label, props, imp, vec(t), with_model(t), now, now))
        events, triggers = [], []
        writes = {row["id"] for row in node_rows.values()}
        for i, name, f, t in plan_rows:
            if name == "create_event":
                eid = str(uuid.uuid4())
                events.append((eid, path, tenant, f.session_id or session_id, f.content, dumps(f.metadata), vec(t),
                               with_model(t), now))
                landed.append(Landed(i, name, eid, "inserted"))
            elif name == "thinking":
                nid = str(uuid.uuid4())
                props = {"thought": f.text, "ttl_hours": WORKING_TTL_HOURS, "turn": turn}
                node_inserts.append((nid, path, tenant, "working", "thought: " + _short(f.text, 80), dumps(props),
                                     NEW_IMPORTANCE, vec(t), with_model(t), now, now))
                writes.add(nid)
                landed.append(Landed(i, name, nid, "inserted"))
            elif name == "set_trigger":
                tid = str(uuid.uuid4())
                triggers.append((tid, path, tenant, f.condition, f.action, f.due_at, now, now))
                landed.append(Landed(i, name, tid, "inserted"))
        for i, name, f, t in plan_rows:  # skills first: the dedupe needs the answer (one round trip each)
            if name == "register_skill":
                sid, new = cur.execute(_SKILL_SQL, {
                    "scope": path, "tenant": tenant, "name": f.name, "description": f.description,
                    "steps": dumps(f.steps), "id": str(uuid.uuid4()), "embedding": vec(t), "model": with_model(t), "now": now,
                }).fetchone()
                landed.append(Landed(i, name, sid, "inserted" if new else "existing"))
                if f.status:
                    notes.append(f"ops[{i}] register_skill {f.name!r}: status {f.status!r} ignored; online skills are filed as draft")
        if summary_text is not None:
            summary_id = str(uuid.uuid4())
            metadata = {"kind": "turn_summary", "turn": turn, "landed": _count_ops(landed), "rejected": _count_ops(rejected)}
            events.append((summary_id, path, tenant, session_id, summary_text, dumps(metadata), vec(len(texts) - 1),
                           with_model(len(texts) - 1), now))
        else:
            summary_id = next(x.id for x in sorted(landed, key=lambda x: x.index) if x.op == "create_event")

        access = [(path, tenant, nid, now, "write") for nid in sorted(writes)]
        access += [(readable[nid], tenant, nid, now, "read") for nid in sorted({r[1] for r in reads} - writes) if nid in readable]
        _write_rows(cur, _UPDATE_NODES_SQL, _UPDATE_NODE_ROW, node_updates)
        _write_rows(cur, _INSERT_NODES_SQL, _INSERT_NODE_ROW, node_inserts)
        _write_rows(cur, _INSERT_EVENTS_SQL, _INSERT_EVENT_ROW, events)
        _write_rows(cur, _INSERT_TRIGGERS_SQL, _INSERT_TRIGGER_ROW, triggers)
        _write_rows(cur, _ACCESS_SQL, _ACCESS_ROW, access)

    receipt = Receipt(
        scope_path=path,
        turn=turn,
        landed=tuple(sorted(landed, key=lambda x: x.index)),
        rejected=tuple(sorted(rejected, key=lambda x: x.index)),
        redacted=tuple(redacted),
        summary_event_id=summary_id,
        notes=tuple(notes),
    )
    if nap and turn % config.quick_nap_interval == 0:
        try:
            report = quick_nap(store_or_conn, scope, config=nap_config, as_of=now)
        except Exception as exc:  # the turn is stored; a failed nap is retried by the next one
            log.exception("quick nap of %s after turn %d failed", scope, turn)
            report = new_report(path, now.isoformat(), status="failed", errors=[f"quick nap failed: {exc}"])
        receipt = replace(receipt, quick_nap=report)
    return receipt


def _count_ops(items: Sequence[Landed | Rejected]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x.op] = out.get(x.op, 0) + 1
    return dict(sorted(out.items()))


def _turn_summary(turn: int, node_rows: dict, plan_rows: list, readable: dict, n_rejected: int) -> str:
    """Counts and labels only: event, thought and trigger texts are stored once, in their own rows."""
    parts = []
    if node_rows:
        labels = [k[1] for k in node_rows]
        shown = ", ".join(_short(lbl) for lbl in labels[:5]) + (f", +{len(labels) - 5} more" if len(labels) > 5 else "")
        parts.append(f"{len(labels)} node(s) written ({shown})")
    kinds = {"create_event": "event(s)", "set_trigger": "trigger(s)", "register_skill": "skill draft(s)", "thinking": "thought(s)"}
    for name, noun in kinds.items():
        n = sum(1 for r in plan_rows if r[1] == name)
        if n:
            parts.append(f"{n} {noun}")
    reads = sum(1 for r in plan_rows if r[1] == "read_node" and r[2].id in readable)
    if reads:
        parts.append(f"{reads} node(s) read")
    if n_rejected:
        parts.append(f"{n_rejected} operation(s) rejected")
    return f"turn {turn}: " + ("; ".join(parts) if parts else "no memory operations")


