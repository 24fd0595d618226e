"""The online path (SPEC §5): live turns write memory, recalls read it, every Nth turn naps.

Synchronous, no orchestrator, one short psycopg transaction per call.  Every function takes a
:class:`~deep_sleep.store.db.Store` (a per-thread connection to its DSN is opened once and reused) or
an open ``psycopg.Connection`` (used as is; if it is already inside a transaction, our work
joins it as a savepoint and the caller commits).

    >>> receipt = record_turn(store, scope, [{"op": "upsert_node", "label": "user: Ada", "properties": {"api_key": "sk-1"}}])  # doctest: +SKIP
    >>> receipt.landed[0].action, receipt.redacted                           # doctest: +SKIP
    ('inserted', ('ops[0].properties.api_key',))
    >>> hits = recall(store, scope, "who is Ada?"); feedback(store, hits[0].recall_id, used=True)   # doctest: +SKIP

**record_turn** files a turn's operations, each checked on its own; a malformed one is rejected
by index and name with the reason, and the valid ones of the same turn still land:

==================  =====================================================  ======================
op                  fields (``?`` optional)                                 lands in
==================  =====================================================  ======================
``upsert_node``     label, properties?, importance? (1–10), layer?          memory_nodes (semantic;
                    (``semantic`` default, or ``working``)                  by label in the exact
                                                                            scope: update, else insert)
``create_event``    content, metadata?, session_id?                         episodic_events
``set_trigger``     condition, action, due_at? (ISO 8601)                   prospective_triggers
``register_skill``  name, description?, steps? (list); status is ignored    procedural_skills, always
                                                                            ``draft`` (same name in
                                                                            the scope: not re-filed)
``thinking``        text                                                    memory_nodes, working,
                                                                            ``ttl_hours`` = 24
``read_node``       id (a node visible from the scope)                      memory_access_log only
==================  =====================================================  ======================

Any op may name its ``layer``; one of the five layers that does not fit the op is rejected.
Limits (a reason names the one broken): :data:`MAX_OPS_PER_TURN` operations per turn;
:data:`MAX_OP_BYTES` bytes of JSON per operation; labels and names :data:`MAX_LABEL_CHARS`
characters with no control characters; texts :data:`MAX_TEXT_CHARS` characters; JSON nesting
:data:`MAX_DEPTH` levels; no NUL characters or lone surrogates anywhere (PostgreSQL cannot store
them); numbers finite.  Unknown extra fields are ignored.

Before anything is stored, every property / metadata / step key that looks like a credential
(:func:`is_credential_key`: a word of the key — split at ``_ - . space`` and camelCase — or two
adjacent words joined, such as ``password``, ``secret``, ``token``, ``api_key``, ``apiKey``,
``private_key``, ``authorization``, ``credential``…, at any depth) gets the value ``"[REDACTED]"``.
It errs on the side of caution: ``max_tokens`` is redacted too.

The turn also writes one episodic event summarising it (``metadata.kind = "turn_summary"``,
counts and labels only: it repeats no event text, so phase 12 does not count an action twice),
and one ``memory_access_log`` row per node it wrote (``write``) or only read (``read``).
Upserts add 1 to ``access_count``; new nodes start at 1.

**recall** — see :func:`recall` for the score and the 12 features.

**quick nap** — every ``quick_nap_interval`` turns of a scope (counted in ``scope_turns``), phases
1, 5 and 10 run for that scope through :func:`deep_sleep.run.plan.plan`, ``validate_diff`` and
``apply_diff(mode="quick_nap")``, on a targeted snapshot (:func:`nap_snapshot`).  Windows: a nap
consolidates the access log from the latest applied run of *either* mode on, so it never
re-strengthens what a nap or a nightly already counted; the nightly must in turn read the access
log only after the latest applied nap (the one change this needs in ``deep_sleep/extract.py``; its
other phases keep the nightly-only window, since the nap does not run them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl
import psycopg

from deep_sleep.core import tables
from deep_sleep.core.embedding import EmbeddingProvider, default_embedder, well_formed
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import SEP, Scope
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.store.db import Store
from deep_sleep.transforms import new_report
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.label_recalls import query_words
from deep_sleep.transforms.train_reranker import N_FEATURES, adjustment

log = logging.getLogger(__name__)

__all__ = [
    "FEATURES", "Hit", "Landed", "Receipt", "Rejected", "feedback", "is_credential_key", "nap_snapshot",
    "quick_nap", "recall", "record_turn", "redact", "summary_candidates",
]

MAX_OPS_PER_TURN = 256
MAX_OP_BYTES = 64 * 1024
MAX_LABEL_CHARS = 512
MAX_TEXT_CHARS = 16_000
MAX_DEPTH = 16
REDACTED = "[REDACTED]"
WORKING_TTL_HOURS = 24
NEW_IMPORTANCE = 5.0
LAYERS = ("semantic", "working", "episodic", "procedural", "prospective")
OP_LAYERS = {
    "upsert_node": ("semantic", "working"),
    "create_event": ("episodic",),
    "set_trigger": ("prospective",),
    "register_skill": ("procedural",),
    "thinking": ("working",),
    "read_node": ("semantic", "working"),
}
OPS = tuple(OP_LAYERS)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_KEY_SPLIT = re.compile(r"[^a-z0-9]+")
CREDENTIAL_WORDS = frozenset(
    """password passwords passwd passphrase pwd secret secrets token tokens credential credentials
    authorization auth cookie cookies bearer pin otp dsn apikey apikeys privatekey accesskey secretkey
    sessionkey clientsecret connectionstring""".split()
)


# ---------------------------------------------------------------------------------------------
# value types


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
    redacted: paths of the credential-looking keys whose values were replaced (``ops[2].properties.api_key``).
    summary_event_id: the turn's episodic summary event.
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


@dataclass(frozen=True)
class Hit:
    """One recalled node: ``score = base + adjustment`` (see :func:`recall`); ``recall_id`` is the
    ``recall_events`` row to give :func:`feedback`; ``via`` the top hit it was reached from, if
    it came by spreading activation."""

    recall_id: str
    node_id: str
    scope_path: str | None
    layer: str
    label: str
    similarity: float
    score: float
    features: tuple[float, ...]
    via: str | None = None


class _Reject(Exception):
    """An operation is malformed; the message is the reason given on the receipt."""


# ---------------------------------------------------------------------------------------------
# connections


_local = threading.local()


def _pg(dsn: str) -> psycopg.Connection:
    """This thread's connection to ``dsn``, opened on first use and reopened if it broke."""
    cache = _local.__dict__.setdefault("pg", {})
    conn = cache.get(dsn)
    if conn is None or conn.closed or conn.broken:
        conn = cache[dsn] = psycopg.connect(dsn)
    elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.rollback()
    return conn


@contextlib.contextmanager
def _connection(target: Store | psycopg.Connection) -> Iterator[psycopg.Connection]:
    if isinstance(target, psycopg.Connection):
        yield target
    elif isinstance(target, Store):
        yield _pg(target.dsn)
    else:
        raise TypeError(f"expected a deep_sleep.store.db.Store or a psycopg.Connection, got {type(target).__name__}")


@contextlib.contextmanager
def _pipelined_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """One transaction in pipeline mode, in as few round trips as the block's reads allow.

    ``with conn.pipeline(), conn.transaction():`` costs three round trips more than it needs:
    psycopg syncs right after ``BEGIN`` (to learn the transaction status), and it nests two more
    pipelines whose exits each sync, before and after ``COMMIT``.  On a connection that is idle
    and not already pipelined, this sends ``BEGIN`` and ``COMMIT`` itself as ordinary pipelined
    statements (the connection is switched to autocommit for the block, so psycopg adds no
    ``BEGIN`` of its own; it is switched back after), so ``BEGIN`` travels with the first reads
    and ``COMMIT`` with the writes.  The transaction is the same: one explicit ``BEGIN … COMMIT``
    block, committed durably unless the block asked otherwise (``SET LOCAL``).  Any error rolls
    it back and is raised, as ``conn.transaction()`` does.  Inside the caller's transaction (the
    work must be a savepoint) or in a caller's pipeline it is ``conn.pipeline()`` +
    ``conn.transaction()`` as before; so it is on a connection with its own isolation level,
    read-only or deferrable setting (psycopg's ``BEGIN`` carries them).
    """
    if (conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            or conn.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF
            or (conn.isolation_level, conn.read_only, conn.deferrable) != (None, None, None)):  # psycopg's BEGIN says more
        with conn.pipeline(), conn.transaction():
            yield
        return
    autocommit = conn.autocommit
    conn.autocommit = True
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            yield
            conn.execute("COMMIT")
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
        raise
    finally:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.autocommit = autocommit


def _store_of(target: Store | psycopg.Connection) -> Store:
    """The store behind ``target`` (the quick nap's apply talks ADBC; Store.adbc pools per thread)."""
    if isinstance(target, Store):
        return target
    info = target.info
    params = info.get_parameters()
    if info.password:
        params["password"] = info.password
    return Store(psycopg.conninfo.make_conninfo(**params))


@lru_cache(maxsize=1)
def _default_config() -> ConsolidationConfig:
    from deep_sleep.transforms.config import load_config

    return load_config()


# ---------------------------------------------------------------------------------------------
# checking and redacting operations


def is_credential_key(key: str) -> bool:
    """Does a property key look like it holds a credential?

    >>> [k for k in ("api_key", "apiKey", "X-Api-Key", "AWS_SECRET_ACCESS_KEY", "author", "tokenizer", "password_hash") if is_credential_key(k)]
    ['api_key', 'apiKey', 'X-Api-Key', 'AWS_SECRET_ACCESS_KEY', 'password_hash']
    """
    words = [w for w in _KEY_SPLIT.split(_CAMEL.sub("_", key).lower()) if w]
    if any(w in CREDENTIAL_WORDS for w in words):
        return True
    if any(a + b in CREDENTIAL_WORDS for a, b in zip(words, words[1:])):
        return True
    return "".join(words) in CREDENTIAL_WORDS


def _check_string(value: str, where: str) -> str:
    if "\x00" in value:
        raise _Reject(f"{where} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Reject(f"{where} is not valid Unicode (it holds a lone surrogate)") from None
    return value


def redact(value: Any, path: str, redacted: list[str], depth: int = 0) -> Any:
    """``value`` with every credential-looking key's value replaced by ``"[REDACTED]"`` (paths
    appended to ``redacted``); raises on what cannot be stored as JSON (the reason names the path)."""
    if depth > MAX_DEPTH:
        raise _Reject(f"{path} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Reject(f"{path}: keys must be strings, got {type(k).__name__} {k!r}")
            _check_string(k, f"{path} key {k[:40]!r}")
            if is_credential_key(k):
                out[k] = REDACTED
                redacted.append(f"{path}.{k}")
            else:
                out[k] = redact(v, f"{path}.{k}", redacted, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [redact(v, f"{path}[{i}]", redacted, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, str):
        return _check_string(value, path)
    if isinstance(value, float) and not math.isfinite(value):
        raise _Reject(f"{path} is {value}; numbers must be finite")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise _Reject(f"{path}: a {type(value).__name__} is not a JSON value")


def _field(op: dict, name: str, kinds: type | tuple[type, ...], what: str, required: bool) -> Any:
    if name not in op or op[name] is None:
        if required:
            raise _Reject(f"field {name!r} is missing ({what} required)")
        return None
    value = op[name]
    if not isinstance(value, kinds) or isinstance(value, bool):  # True is an int to Python, not to JSON
        raise _Reject(f"field {name!r} must be {what}, got {type(value).__name__}")
    return value


def _label(op: dict, name: str) -> str:
    value = _field(op, name, str, "a string", True)
    if not value.strip():
        raise _Reject(f"field {name!r} is blank")
    if len(value) > MAX_LABEL_CHARS:
        raise _Reject(f"field {name!r} has {len(value)} characters; the limit is {MAX_LABEL_CHARS}")
    bad = _CONTROL.search(value)
    if bad:
        raise _Reject(f"field {name!r} contains control character {bad.group()!r} at position {bad.start()}")
    return _check_string(value, f"field {name!r}")


def _text(op: dict, name: str, required: bool = True) -> str | None:
    value = _field(op, name, str, "a string", required)
    if value is None:
        return None
    if required and not value.strip():
        raise _Reject(f"field {name!r} is blank")
    if len(value) > MAX_TEXT_CHARS:
        raise _Reject(f"field {name!r} has {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
    return _check_string(value, f"field {name!r}")


def _json(op: dict, name: str, kind: type, redacted: list[str], index: int) -> Any:
    value = _field(op, name, kind, "a JSON object" if kind is dict else "a list", False)
    return redact(value if value is not None else kind(), f"ops[{index}].{name}", redacted)


def _check_op(index: int, op: Any, redacted: list[str]) -> tuple[str, dict]:
    """(op name, normalised fields) or raise :class:`_Reject`."""
    if not isinstance(op, dict):
        raise _Reject(f"an operation must be a JSON object, got {type(op).__name__}")
    name = op.get("op")
    if not isinstance(name, str):
        raise _Reject("field 'op' is missing" if name is None else f"field 'op' must be a string, got {type(name).__name__}")
    if name not in OP_LAYERS:
        raise _Reject(f"unknown op {name[:60]!r}; ops are {', '.join(OPS)}")
    size = len(json.dumps(op, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass"))
    if size > MAX_OP_BYTES:
        raise _Reject(f"payload is {size} bytes; the limit is {MAX_OP_BYTES} bytes per operation")
    layer = op.get("layer")
    if layer is not None:
        if not isinstance(layer, str) or layer not in LAYERS:
            raise _Reject(f"unknown layer {layer!r}; layers are {', '.join(LAYERS)}")
        if layer not in OP_LAYERS[name]:
            raise _Reject(f"layer {layer!r} does not fit {name} (it writes {' or '.join(OP_LAYERS[name])})")
    mine: list[str] = []
    if name == "upsert_node":
        importance = _field(op, "importance", (int, float), "a number in [1, 10]", False)
        if importance is not None and not (math.isfinite(importance) and 1.0 <= importance <= 10.0):
            raise _Reject(f"field 'importance' is {importance}; it must be within [1, 10]")
        fields = {
            "label": _label(op, "label"),
            "properties": _json(op, "properties", dict, mine, index),
            "importance": None if importance is None else float(importance),
            "layer": layer or "semantic",
        }
    elif name == "create_event":
        fields = {
            "content": _text(op, "content"),
            "metadata": _json(op, "metadata", dict, mine, index),
            "session_id": _label(op, "session_id") if op.get("session_id") is not None else None,
        }
    elif name == "set_trigger":
        due = _field(op, "due_at", str, "an ISO 8601 timestamp", False)
        try:
            due_at = utc(due) if due is not None else None
        except ValueError:
            raise _Reject(f"field 'due_at' is {due[:40]!r}, not an ISO 8601 timestamp") from None
        fields = {"condition": _text(op, "condition"), "action": _text(op, "action"), "due_at": due_at}
    elif name == "register_skill":
        status = op.get("status")
        fields = {
            "name": _label(op, "name"),
            "description": _text(op, "description", required=False) or "",
            "steps": _json(op, "steps", list, mine, index),
            "asked_status": status if isinstance(status, str) and status != "draft" else None,
        }
    elif name == "thinking":
        fields = {"text": _text(op, "text")}
    else:  # read_node
        raw = _field(op, "id", str, "a node id (UUID)", True)
        try:
            fields = {"id": str(uuid.UUID(raw))}
        except ValueError:
            raise _Reject(f"field 'id' is {raw[:40]!r}, not a UUID") from None
    redacted += mine
    return name, fields


# ---------------------------------------------------------------------------------------------
# record_turn

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
    " embedding = v.embedding, updated_at = v.updated_at, access_count = n.access_count + 1"
    " FROM (VALUES {rows}) AS v(properties, importance, embedding, updated_at, id) WHERE n.id = v.id"
)
_UPDATE_NODE_ROW = "(%s::jsonb, %s::float8, %s::vector, %s::timestamptz, %s::uuid)"
_INSERT_NODES_SQL = (
    "INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, access_count, embedding,"
    " created_at, updated_at) VALUES {rows}"
)
_INSERT_NODE_ROW = "(%s::uuid, %s, %s, %s, %s, %s::jsonb, %s, 1, %s::vector, %s, %s)"
_INSERT_EVENTS_SQL = (
    "INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, metadata, embedding, created_at) VALUES {rows}"
)
_INSERT_EVENT_ROW = "(%s::uuid, %s, %s, %s, %s, %s::jsonb, %s::vector, %s)"
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
    " created_at, updated_at) SELECT %(id)s::uuid, %(scope)s, %(tenant)s, %(name)s, %(description)s, %(steps)s::jsonb,"
    " 'draft', 'online', %(embedding)s::vector, %(now)s, %(now)s WHERE NOT EXISTS (SELECT 1 FROM found) RETURNING id)"
    " SELECT id::text, true FROM ins UNION ALL SELECT id::text, false FROM found"
)


def _visible(alias: str, legacy: bool, paths: str = "%(paths)s", tenant: str = "%(tenant)s") -> str:
    """Prefix isolation: the row's path is one of the reader's ancestor paths (exact ``= ANY``).
    A ``tenant/<id>``-rooted reader also sees that tenant's legacy rows (``scope_path IS NULL``)."""
    clause = f"{alias}.scope_path = ANY({paths})"
    return f"({clause} OR ({alias}.scope_path IS NULL AND {alias}.tenant_id = {tenant}))" if legacy else clause


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _vector(row: np.ndarray) -> str | None:
    """pgvector's text form, or None for an all-zero row (nothing to embed: cosine is undefined)."""
    if not row.any():
        return None
    return "[" + ",".join(map(repr, row.tolist())) + "]"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            if not k.startswith("_"):
                yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str) and value != REDACTED:
        yield value


def _node_text(label: str, properties: dict) -> str:
    return " ".join([label, *_strings(properties)])[:2000]


def _short(text: str, n: int = 60) -> str:
    text = _CONTROL.sub(" ", text).strip()
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
    scope = Scope.coerce(scope)
    config = config or _default_config()
    embedder = embedder or default_embedder()
    now = utc(now or datetime.now(UTC))
    if ops is None:
        ops = []
    if isinstance(ops, (str, bytes, dict)) or not isinstance(ops, Sequence):
        raise TypeError(f"record_turn: ops must be a list of operations, got {type(ops).__name__}")
    ops = list(ops) + [{"op": "thinking", "text": t} for t in thinking]
    if session_id is not None:
        session_id = _label({"session_id": session_id}, "session_id")

    rejected: list[Rejected] = []
    redacted: list[str] = []
    accepted: list[tuple[int, str, dict]] = []
    for i, op in enumerate(ops):
        name = op.get("op") if isinstance(op, dict) and isinstance(op.get("op"), str) else "?"
        if i >= MAX_OPS_PER_TURN:
            rejected.append(Rejected(i, name, f"the turn carries {len(ops)} operations; the limit is {MAX_OPS_PER_TURN}"))
            continue
        try:
            accepted.append((i, *_check_op(i, op, redacted)))
        except _Reject as exc:
            rejected.append(Rejected(i, name, str(exc)))

    path, tenant = scope.path, scope.tenant_id
    landed: list[Landed] = []
    notes: list[str] = []
    # upserts: fold repeats of one (layer, label) in turn order, then update or insert
    upserts: dict[tuple[str, str], dict] = {}
    for i, name, f in accepted:
        if name == "upsert_node":
            slot = upserts.setdefault((f["layer"], f["label"]), {"indexes": [], "properties": {}, "importance": None})
            slot["indexes"].append(i)
            slot["properties"].update(f["properties"])
            if f["importance"] is not None:
                slot["importance"] = f["importance"]
    reads = [(i, f["id"]) for i, name, f in accepted if name == "read_node"]

    # Pipeline mode: BEGIN and the three reads go in one round trip, the writes and COMMIT in one more.
    with _connection(store_or_conn) as conn, _pipelined_transaction(conn):
        cur, found_cur, read_cur = conn.cursor(), conn.cursor(), conn.cursor()
        if not durable:
            cur.execute("SET LOCAL synchronous_commit = off")
        cur.execute(_TURN_SQL, (path, tenant, now))
        if upserts:
            found_cur.execute(_EXISTING_SQL, (path, sorted({k[1] for k in upserts}), sorted({k[0] for k in upserts})))
        if reads:
            sql = f"SELECT id::text, scope_path FROM memory_nodes n WHERE n.id = ANY(%(ids)s::uuid[]) AND {_visible('n', scope.levels[0][0] == 'tenant')}"
            read_cur.execute(sql, {"ids": [r[1] for r in reads], "paths": scope.ancestor_paths(), "tenant": tenant})
        turn = cur.fetchone()[0]
        existing: dict[tuple[str, str], tuple[str, dict]] = {}
        for nid, layer, label, props in found_cur.fetchall() if upserts else ():
            existing.setdefault((layer, label), (nid, props if isinstance(props, dict) else {}))
        visible: dict[str, str | None] = dict(read_cur.fetchall()) if reads else {}

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
        plan_rows: list[tuple[int, str, dict, int]] = []
        for i, name, f in accepted:
            if name == "create_event":
                plan_rows.append((i, name, f, len(texts)))
                texts.append(f["content"])
            elif name == "thinking":
                plan_rows.append((i, name, f, len(texts)))
                texts.append(f["text"])
            elif name == "register_skill":
                plan_rows.append((i, name, f, len(texts)))
                texts.append(f"{f['name']} {f['description']}")
            elif name in ("set_trigger", "read_node"):
                plan_rows.append((i, name, f, -1))

        # what lands, in turn order
        for key, row in node_rows.items():
            for i in row["slot"]["indexes"]:
                landed.append(Landed(i, "upsert_node", row["id"], row["action"]))
        for i, name, f, _ in plan_rows:
            if name == "read_node":
                if f["id"] in visible:
                    landed.append(Landed(i, name, f["id"], "logged"))
                else:
                    rejected.append(Rejected(i, name, f"node {f['id']} does not exist or is not visible from scope {scope}"))
        summary_text = summary or _turn_summary(turn, node_rows, plan_rows, visible, len(rejected))
        texts.append(summary_text)
        vectors = embedder.embed(texts)

        # write
        node_updates, node_inserts = [], []
        for (layer, label), row in node_rows.items():
            props, vec = _dumps(row["properties"]), _vector(vectors[row["text"]])
            if row["action"] == "updated":
                node_updates.append((props, row["slot"]["importance"], vec, now, row["id"]))
            else:
                imp = row["slot"]["importance"] or NEW_IMPORTANCE
                node_inserts.append((row["id"], path, tenant, layer, label, props, imp, vec, now, now))
        events, triggers = [], []
        writes = {row["id"] for row in node_rows.values()}
        for i, name, f, t in plan_rows:
            if name == "create_event":
                eid = str(uuid.uuid4())
                events.append((eid, path, tenant, f["session_id"] or session_id, f["content"], _dumps(f["metadata"]), _vector(vectors[t]), now))
                landed.append(Landed(i, name, eid, "inserted"))
            elif name == "thinking":
                nid = str(uuid.uuid4())
                props = {"thought": f["text"], "ttl_hours": WORKING_TTL_HOURS, "turn": turn}
                node_inserts.append((nid, path, tenant, "working", "thought: " + _short(f["text"], 80), _dumps(props),
                                     NEW_IMPORTANCE, _vector(vectors[t]), now, now))
                writes.add(nid)
                landed.append(Landed(i, name, nid, "inserted"))
            elif name == "set_trigger":
                tid = str(uuid.uuid4())
                triggers.append((tid, path, tenant, f["condition"], f["action"], f["due_at"], now, now))
                landed.append(Landed(i, name, tid, "inserted"))
        for i, name, f, t in plan_rows:  # skills first: the dedupe needs the answer (one round trip each)
            if name == "register_skill":
                sid, new = cur.execute(_SKILL_SQL, {
                    "scope": path, "tenant": tenant, "name": f["name"], "description": f["description"],
                    "steps": _dumps(f["steps"]), "id": str(uuid.uuid4()), "embedding": _vector(vectors[t]), "now": now,
                }).fetchone()
                landed.append(Landed(i, name, sid, "inserted" if new else "existing"))
                if f["asked_status"]:
                    notes.append(f"ops[{i}] register_skill {f['name']!r}: status {f['asked_status']!r} ignored; online skills are filed as draft")
        summary_id = str(uuid.uuid4())
        counts = _count_ops(landed)
        metadata = {"kind": "turn_summary", "turn": turn, "landed": counts, "rejected": _count_ops(rejected)}
        events.append((summary_id, path, tenant, session_id, summary_text, _dumps(metadata), _vector(vectors[-1]), now))

        access = [(path, tenant, nid, now, "write") for nid in sorted(writes)]
        access += [(visible[nid], tenant, nid, now, "read") for nid in sorted({r[1] for r in reads} - writes) if nid in visible]
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
            report = quick_nap(store_or_conn, scope, config=config, as_of=now)
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


def _turn_summary(turn: int, node_rows: dict, plan_rows: list, visible: dict, n_rejected: int) -> str:
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
    reads = sum(1 for r in plan_rows if r[1] == "read_node" and r[2]["id"] in visible)
    if reads:
        parts.append(f"{reads} node(s) read")
    if n_rejected:
        parts.append(f"{n_rejected} operation(s) rejected")
    return f"turn {turn}: " + ("; ".join(parts) if parts else "no memory operations")


# ---------------------------------------------------------------------------------------------
# recall and feedback

FEATURES = (
    "similarity",      # cosine similarity of the query and the node (0 without an embedding)
    "importance",      # importance / 10
    "recency",         # exp(−days since updated_at / 30)
    "access",          # log(1 + access_count) / log(1 + 1000), capped at 1
    "degree",          # log(1 + current incident edges) / log(1 + 200), edges counted up to 100 each way
    "neighbour_hop",   # 1 if reached only by spreading activation from a top hit, else 0
    "spread",          # the activation it got that way: 0.5 × the top hit's similarity × min(edge weight, 1)
    "working",         # 1 for working memory, 0 for semantic
    "label_length",    # min(label characters, 200) / 200
    "scope_distance",  # levels between the reader's scope and the node's, / the reader's depth (0 = own scope)
    "query_overlap",   # share of the query's words (label_recalls.query_words) that are words of the label
    "meta",            # 1 for META: summary nodes
)
assert len(FEATURES) == N_FEATURES
SPREAD = 0.5
RECENCY_DAYS = 30.0
DEGREE_LIMIT = 100
SEED_MIN = 20
FAN_OUT = 8

# Recall's log is training telemetry: it may lose its last fraction of a second in a server crash
# rather than wait for a WAL flush on every query (synchronous_commit = off, this transaction only).
_SETTINGS_SQL = (
    "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'relaxed_order', true),"
    " set_config('synchronous_commit', 'off', true)"
)
_MODEL_SQL = "SELECT weights, bias FROM reranker_models WHERE scope_path = %s AND tenant_id = %s"


@lru_cache(maxsize=2)
def _candidates_sql(legacy: bool) -> str:
    n, e = _visible("n", legacy), _visible("e", legacy)
    return f"""
WITH seed AS (
    SELECT n.id, n.scope_path, n.layer, n.label, n.importance, n.access_count, n.updated_at,
           n.embedding <=> %(q)s::vector AS dist
    FROM memory_nodes n
    WHERE {n} AND n.embedding IS NOT NULL
    ORDER BY n.embedding <=> %(q)s::vector
    LIMIT %(n_seed)s
),
top AS (SELECT id FROM seed ORDER BY dist, id LIMIT %(n_top)s),
hop AS (
    SELECT h.id, h.via, h.weight FROM top t CROSS JOIN LATERAL (
        (SELECT e.target_id AS id, t.id AS via, e.weight FROM memory_edges e
          WHERE e.source_id = t.id AND {e} AND e.valid_to IS NULL ORDER BY e.weight DESC, e.target_id LIMIT %(fan)s)
        UNION ALL
        (SELECT e.source_id, t.id, e.weight FROM memory_edges e
          WHERE e.target_id = t.id AND {e} AND e.valid_to IS NULL ORDER BY e.weight DESC, e.source_id LIMIT %(fan)s)
    ) h
),
nb AS (
    SELECT DISTINCT ON (h.id) h.id, h.via, h.weight FROM hop h
    WHERE h.id NOT IN (SELECT id FROM seed) ORDER BY h.id, h.weight DESC, h.via
),
cand AS (
    SELECT s.*, NULL::uuid AS via, NULL::float8 AS weight FROM seed s
    UNION ALL
    SELECT n.id, n.scope_path, n.layer, n.label, n.importance, n.access_count, n.updated_at,
           n.embedding <=> %(q)s::vector, nb.via, nb.weight
    FROM nb JOIN memory_nodes n ON n.id = nb.id WHERE {n}
)
SELECT c.id::text, c.scope_path, c.layer, c.label, c.importance, c.access_count, c.updated_at, c.dist, c.via::text, c.weight,
       (SELECT count(*) FROM (SELECT 1 FROM memory_edges e WHERE e.source_id = c.id AND {e} AND e.valid_to IS NULL LIMIT %(deg)s) a)
     + (SELECT count(*) FROM (SELECT 1 FROM memory_edges e WHERE e.target_id = c.id AND {e} AND e.valid_to IS NULL LIMIT %(deg)s) b)
FROM cand c"""


def _model(row: tuple | None) -> tuple[np.ndarray, float]:
    """The scope's reranker (weights, bias); none yet, or unreadable: zeros (no adjustment)."""
    if row and row[0] is not None and len(row[0]) == N_FEATURES and all(math.isfinite(x) for x in row[0]):
        return np.asarray(row[0], dtype=np.float64), float(row[1] or 0.0)
    return np.zeros(N_FEATURES), 0.0


def recall(
    store_or_conn: Store | psycopg.Connection,
    scope: Scope | str,
    query: str,
    k: int = 5,
    *,
    now: datetime | None = None,
    embedder: EmbeddingProvider | None = None,
) -> list[Hit]:
    """The ``k`` best nodes for ``query`` visible from ``scope``, each logged to ``recall_events``.

    Candidates: the ``max(4k, 20)`` nearest nodes by cosine distance among rows whose
    ``scope_path = ANY(scope.ancestor_paths())`` (HNSW index, ``ORDER BY embedding <=> q``,
    iterative scan so a small scope among many still fills its quota), plus one hop of
    spreading activation: up to 8 current edges each way (highest weight first) of each of the
    ``k`` nearest, to neighbours in the same visible paths.

    Score: ``base + clip(w · x + b, −0.25, +0.25)`` where ``base`` is the similarity (for a
    neighbour, the larger of its own similarity and its spread) and ``w, b`` are the scope's
    ``reranker_models`` row (none yet: no adjustment).  ``x`` are the 12 :data:`FEATURES`.
    Ties go to the higher similarity, then the smaller id.

    One statement logs the returned hits: a ``recall_events`` row each (query, node, similarity,
    features, score; unlabelled) and a ``memory_access_log`` ``read`` row each, under the node's
    own scope path — a recalled node was read, and phase 1 counts reads.  Node rows are not
    touched (no version bump: a recall never makes a consolidation run conflict).
    The query is logged as given, less NUL characters, cut at :data:`MAX_TEXT_CHARS`, with any lone
    surrogate replaced by U+FFFD (PostgreSQL cannot store one).
    """
    scope = Scope.coerce(scope)
    if not isinstance(query, str):
        raise TypeError(f"recall: query must be a string, got {type(query).__name__}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"recall: k must be a positive integer, got {k!r}")
    query = well_formed(query.replace("\x00", "")[:MAX_TEXT_CHARS])
    now = utc(now or datetime.now(UTC))
    embedder = embedder or default_embedder()
    qvec = _vector(embedder.embed([query])[0])
    if qvec is None:
        return []
    legacy = scope.levels[0][0] == "tenant"
    n_seed = max(4 * k, SEED_MIN)
    words = set(query_words(query))
    # Pipeline mode: BEGIN, settings, model and candidates in one round trip; the log and COMMIT in one more.
    with _connection(store_or_conn) as conn, _pipelined_transaction(conn):
        cur, model_cur = conn.cursor(), conn.cursor()
        cur.execute(_SETTINGS_SQL, (str(max(40, n_seed)),))
        model_cur.execute(_MODEL_SQL, (scope.path, scope.tenant_id))
        cur.execute(_candidates_sql(legacy), {
            "q": qvec, "paths": scope.ancestor_paths(), "tenant": scope.tenant_id,
            "n_seed": n_seed, "n_top": k, "fan": FAN_OUT, "deg": DEGREE_LIMIT,
        })
        rows = cur.fetchall()
        weights, bias = _model(model_cur.fetchone())
        if not rows:
            return []
        seed_sim = {r[0]: 1.0 - r[7] for r in rows if r[8] is None}
        scored = []
        for nid, spath, layer, label, importance, access_count, updated_at, dist, via, weight, degree in rows:
            sim = 0.0 if dist is None or not math.isfinite(dist) else max(-1.0, min(1.0, 1.0 - dist))
            spread = SPREAD * seed_sim.get(via, 0.0) * min(max(weight or 0.0, 0.0), 1.0) if via else 0.0
            base = max(sim, spread) if via else sim
            age_days = max((now - updated_at).total_seconds(), 0.0) / 86400.0
            up = scope.depth - (spath.count(SEP) + 1) // 2 if spath else scope.depth - 1
            label_words = set(query_words(label))
            x = (
                sim,
                min(max(importance / 10.0, 0.0), 1.0) if importance is not None and math.isfinite(importance) else 0.5,
                math.exp(-age_days / RECENCY_DAYS),
                min(math.log1p(max(access_count, 0)) / math.log1p(1000), 1.0),
                min(math.log1p(degree) / math.log1p(2 * DEGREE_LIMIT), 1.0),
                1.0 if via else 0.0,
                spread,
                1.0 if layer == "working" else 0.0,
                min(len(label), 200) / 200.0,
                up / scope.depth,
                len(words & label_words) / len(words) if words else 0.0,
                1.0 if label.startswith("META:") else 0.0,
            )
            scored.append((base, sim, nid, spath, layer, label, x, via))
        adj = adjustment(weights, bias, np.asarray([s[6] for s in scored], dtype=np.float64))
        ranked = sorted(
            ((base + float(a), sim, nid, spath, layer, label, x, via) for (base, sim, nid, spath, layer, label, x, via), a in zip(scored, adj)),
            key=lambda r: (-r[0], -r[1], r[2]),
        )[:k]
        hits = [Hit(str(uuid.uuid4()), nid, spath, layer, label, sim, score, tuple(float(v) for v in x), via)
                for score, sim, nid, spath, layer, label, x, via in ranked]
        values = ", ".join(["(%s::uuid, %s, %s, %s, %s::uuid, %s, %s::float8[], %s, %s)"] * len(hits))
        reads = ", ".join(["(%s, %s, %s::uuid, %s, 'read')"] * len(hits))
        params: list[Any] = []
        for h in hits:
            params += [h.recall_id, scope.path, scope.tenant_id, query, h.node_id, h.similarity, list(h.features), h.score, now]
        for h in hits:
            params += [h.scope_path, scope.tenant_id, h.node_id, now]
        cur.execute(
            f"WITH logged AS (INSERT INTO recall_events (id, scope_path, tenant_id, query, node_id, similarity, features, score,"
            f" created_at) VALUES {values} RETURNING 1)"
            f" INSERT INTO memory_access_log (scope_path, tenant_id, node_id, accessed_at, kind) VALUES {reads}",
            params,
        )
    return hits


def feedback(store_or_conn: Store | psycopg.Connection, recall_id: str, used: bool) -> bool:
    """Label a recall explicitly: 1.0 if the conversation used the hit, 0.0 if it ignored it
    (``label_source = "explicit"``; phase D2 never overwrites it, phase D3 weighs it double).
    Clears ``trained_at`` so the next training step learns from the new label.  Returns whether
    the recall exists."""
    if not isinstance(used, bool):
        raise TypeError(f"feedback: used must be True or False, got {used!r}")
    rid = str(uuid.UUID(str(recall_id)))
    with _connection(store_or_conn) as conn, conn.transaction():
        row = conn.execute(
            "UPDATE recall_events SET label = %s, label_source = 'explicit', trained_at = NULL WHERE id = %s::uuid RETURNING 1",
            (1.0 if used else 0.0, rid),
        ).fetchone()
    return row is not None


# ---------------------------------------------------------------------------------------------
# the quick nap

_NAP_PREVIOUS_SQL = (
    "SELECT max(as_of) FROM consolidation_runs WHERE scope_path = %s AND status = 'applied' AND mode IN ('nightly', 'quick_nap')"
)


def _select(table: str) -> str:
    return ", ".join(c.select_sql for c in tables.TABLES[table])


def _frame(table: str, rows: list[tuple]) -> pl.DataFrame:
    schema = tables.schema(table)
    return tables.conform(table, pl.DataFrame(rows, schema=schema, orient="row"))


def summary_candidates(scope_path: str, events: pl.DataFrame, config: Any) -> list[str]:
    """Ids of the ``META:episodic_summary`` nodes phase 10 would write for ``events`` (the oldest
    events, ordered by ``(created_at, id)``): its documented rule — batches of ``batch_size`` from
    the oldest, at most ``max_batches``, while more than ``threshold``; id = UUIDv5 of the batch's
    first and last event ids.  (tests/online/test_online.py checks this against the phase itself.)"""
    from deep_sleep.transforms._common import created_id
    from deep_sleep.transforms.episodic_summary import PHASE

    excess = events.height - config.threshold
    if excess <= 0:
        return []
    size = config.batch_size
    ids = events.get_column("id").to_list()
    batches = min(config.max_batches, -(-excess // size))
    return [created_id(scope_path, PHASE, f"{ids[b * size]}|{ids[b * size + size - 1]}") for b in range(batches)]


def nap_snapshot(conn: psycopg.Connection, scope: Scope | str, as_of: datetime, config: ConsolidationConfig) -> Snapshot:
    """The targeted snapshot of a quick nap: exactly what phases 1, 5 and 10 read, nothing else.

    In one ``REPEATABLE READ, READ ONLY`` transaction, for the exact ``scope_path``:

    - ``previous_run_as_of``: the latest applied run of either mode (nightly or quick nap);
      the window is ``(max(as_of − lookback_hours, previous_run_as_of), as_of]``;
    - ``memory_access_log``: the rows of the window (phase 1 counts them);
    - ``memory_nodes``: the nodes those rows touch (phase 1 updates them), the ``SOUL:`` nodes
      updated in the window (phase 5 reads them), and the summary nodes phase 10 would create
      if they already exist (it refreshes those instead);
    - ``soul_profiles``: all of the scope's (a handful of keys);
    - ``episodic_events``: the oldest ``N = threshold + batch_size × max_batches`` by
      ``(created_at, id)``.

    Why N events are exact for phase 10.  The phase reads the count ``C`` and the oldest
    ``take = min(max_batches, ⌈(C − threshold) / batch_size⌉) × batch_size`` events.  If
    ``C ≤ N`` the snapshot holds every event, so it sees what a whole-scope extract sees.  If
    ``C > N`` it sees ``C' = N``: then ``C' − threshold = batch_size × max_batches`` gives
    ``take' = max_batches × batch_size``, and the real ``C − threshold > batch_size × max_batches``
    gives ``⌈…⌉ > max_batches`` and so the same ``take``; both take the oldest ``take`` events,
    and the oldest ``take ≤ N`` of the scope are the oldest ``take`` of the N oldest.  The
    ordering is the same on both sides: ``uuid`` order in PostgreSQL is the order of the
    canonical lower-case text the phase sorts.
    """
    scope = Scope.coerce(scope)
    path = scope.path
    as_of = utc(as_of)
    es = config.episodic_summary
    fresh = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # Two round trips (pipeline mode): BEGIN and what needs no window, then what does and COMMIT.
    with _pipelined_transaction(conn):
        if fresh:  # inside a caller's transaction we read in its snapshot instead
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute("SET LOCAL TimeZone = 'UTC'")
        head, ev_cur, soul_cur = conn.cursor(), conn.cursor(), conn.cursor()
        head.execute(f"SELECT now(), ({_NAP_PREVIOUS_SQL})", (path,))
        ev_cur.execute(
            f"SELECT {_select('episodic_events')} FROM episodic_events WHERE scope_path = %s ORDER BY created_at, id LIMIT %s",
            (path, es.threshold + es.batch_size * es.max_batches))
        soul_cur.execute(f"SELECT {_select('soul_profiles')} FROM soul_profiles WHERE scope_path = %s", (path,))
        taken_at, previous = head.fetchone()
        events = _frame("episodic_events", ev_cur.fetchall())
        souls = _frame("soul_profiles", soul_cur.fetchall())
        start = as_of - timedelta(hours=config.lookback_hours)
        if previous is not None:
            start = max(start, previous)
        window = (path, start, as_of)
        summary_ids = summary_candidates(path, events, es) if es.enabled else []
        cols = _select("memory_nodes")
        access_cur, node_cur = conn.cursor(), conn.cursor()
        access_cur.execute(
            f"SELECT {_select('memory_access_log')} FROM memory_access_log"
            " WHERE scope_path = %s AND accessed_at > %s AND accessed_at <= %s", window)
        node_cur.execute(
            f"SELECT {cols} FROM memory_nodes WHERE scope_path = %s AND id IN (SELECT node_id FROM memory_access_log"
            "  WHERE scope_path = %s AND accessed_at > %s AND accessed_at <= %s)"
            f" UNION SELECT {cols} FROM memory_nodes WHERE scope_path = %s AND label LIKE 'SOUL:%%'"
            "  AND updated_at > %s AND updated_at <= %s"
            f" UNION SELECT {cols} FROM memory_nodes WHERE scope_path = %s AND id = ANY(%s::uuid[])",
            (path, *window, *window, path, summary_ids))
    # fetched after the block: the second batch's results come back with its COMMIT (one round trip)
    access = _frame("memory_access_log", access_cur.fetchall())
    nodes = _frame("memory_nodes", node_cur.fetchall()).sort("id")
    return Snapshot(
        scope_path=path,
        taken_at=utc(taken_at),
        previous_run_as_of=utc(previous) if previous is not None else None,
        frames={"memory_access_log": access, "memory_nodes": nodes, "soul_profiles": souls, "episodic_events": events},
    )


def quick_nap(
    store_or_conn: Store | psycopg.Connection,
    scope: Scope | str,
    *,
    config: ConsolidationConfig | None = None,
    as_of: datetime | None = None,
) -> ConsolidationReport:
    """Phases 1, 5 and 10 for one scope, now: targeted snapshot → plan → validate → guarded apply.

    The same transforms, validation and version-guarded apply as the nightly run; the run is
    recorded in ``consolidation_runs`` with ``mode = 'quick_nap'`` (applied, or failed with the
    failing checks).  No snapshot directory is written: the nap's diff is small and its deleted
    events are archived whole by the apply.
    """
    from deep_sleep.run.apply import apply_diff, record_run
    from deep_sleep.run.plan import plan
    from deep_sleep.transforms import QUICK_NAP
    from deep_sleep.validation import validate_diff

    scope = Scope.coerce(scope)
    config = config or _default_config()
    started = datetime.now(UTC)
    as_of = utc(as_of or started)
    t0 = time.perf_counter()
    with _connection(store_or_conn) as conn:
        snapshot = nap_snapshot(conn, scope, as_of, config)
    t1 = time.perf_counter()
    planned = plan(snapshot, config, as_of, phases=QUICK_NAP)
    t2 = time.perf_counter()
    failures = validate_diff(planned.diff, planned.snapshot, config)
    t3 = time.perf_counter()
    timings = {**planned.report.timings, "extract": round(t1 - t0, 6), "transform": round(t2 - t1, 6), "validate": round(t3 - t2, 6)}
    report = planned.report.with_(run_id=str(uuid.uuid4()), timings=timings)
    store = _store_of(store_or_conn)
    if failures.height:
        errors = [
            f"validation failed: {r['check']} — {r['table']}.{r['kind']} from phase {r['phase']}, row {r['id']}"
            for r in failures.head(20).iter_rows(named=True)
        ]
        report = report.with_(status="failed", errors=report.errors + errors, validation=failures.head(200).to_dicts())
        record_run(store, report, "quick_nap", started, "failed")
        return report
    result = apply_diff(store, planned.diff, report, mode="quick_nap", started_at=started, quarantined=planned.quarantined)
    timings["apply"] = round(time.perf_counter() - t3, 6)
    return report.with_(status="applied", rows_changed=result.applied, conflicts=result.conflicts, timings=timings)
