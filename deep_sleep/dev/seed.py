"""A realistic, deterministic synthetic memory store: generator + bulk loader.

Tests, benchmarks and demos need a store where every consolidation phase (SPEC §3) has work
to do, at sizes from a few hundred rows to a million nodes in one scope.  :func:`generate` is a
pure function of a :class:`SeedSpec` (same spec, same frames, byte for byte) and is vectorized
with numpy/polars: the only Python loops run per scope or over a handful of special rows.
:func:`load` bulk-inserts the frames through ADBC (Arrow COPY into temporary staging tables,
then one set-based ``INSERT … SELECT`` per table with the casts of :mod:`deep_sleep.core.tables`),
in one transaction; a large load into an empty table drops and rebuilds that table's indexes
inside the transaction (``REBUILD_MIN_ROWS``).

What the data holds (per scope, ``as_of`` = ``spec.now``):

* **Scopes** — per tenant an ``org`` root scope and ``scopes_per_tenant`` leaves
  ``org/<tenant>/brand/<brand>/conversation/<style>``.  Leaves hold ``nodes_per_scope`` nodes
  each; the org scope holds ``max(30, nodes_per_scope // 10)`` (or ``nodes_per_scope`` when
  ``scopes_per_tenant == 0``, the way to get exactly one big scope).
* **memory_nodes** — labels ``"<prefix>: <words>"`` or ``"<prefix> <words>"`` with prefixes
  drawn Zipf-like from 50 topics (so prefix groups are large); ~3 % of labels carry a risk
  marker word (``errors``, ``risky``, ``Critical``…), ~1 % a near miss (``terror``,
  ``asterisk``…); some string property values carry markers too, and a few marker nodes are
  already tagged.  Each scope's first recent ordinary nodes guarantee the phase-2 cases: two
  marker labels, a near miss, a marker only in a property, one already tagged.  Importance is a
  mixture (~5 % at 10.0, ~15 % below 4, some at exactly 5.0 and 1.0).  ~15 % of semantic nodes
  were updated in the last 24 h, in bursts (so co-occurrence has pairs within 900 s); the rest
  spread over ``days`` with more density towards ``now``.  ~5 % are ``working`` nodes updated
  in the last 96 h, most with ``ttl_hours`` in {1, 4, 24, 72} (some expired, some not), some
  without.  ~2 % of semantic nodes carry ``ttl_hours`` too.  ``last_decayed_at`` is null except
  on some nodes older than 30 days (a quarter of those decayed within the last 24 h, a quarter
  1–20 days ago).  Every scope also has protected nodes: two ``SOUL:name`` edits (the newer
  wins), ``SOUL:role``, ``SOUL:personality``, ``SOUL:favorite_color`` (a key phase 5 must
  reject), all edited within the last 24 h with ``{"_last_edited_by": "user_manual_edit",
  "value": …}``, and ``AGENT_IDENTITY:`` nodes, one of them old, unimportant and unconnected
  (pruning and decay must spare it).  The first six nodes are "hot": importance 9, no
  TTL, referenced by episodic markers.
* **memory_edges** — ~1.5 per node between *semantic* nodes only (no edge touches a working
  node, so phase 8 deletions never leave edges behind), hub-skewed targets (so many nodes have
  ≤ 1 neighbour), relations RELATED_TO, CO_OCCURRED, is, lives_in, works_at, prefers, CAUSES,
  PART_OF; functional groups (one source, 2–3 ``is``/``lives_in`` targets); CO_OCCURRED edges
  between some recent nodes close in time (to be reinforced); no self loops, no duplicate
  (scope, source, target, relation), ``valid_to`` null, weights ≥ 0.
* **episodic_events** — ``max(120, nodes // 5)`` per scope over a few dozen sessions: marker
  events ``[semantic:<hot label>]`` pairs (mostly in the last 7 days, repeated pairs),
  ``[SOUL:name]`` mentions, an occasional unresolvable ``[semantic:…]``, action sentences
  ("I deployed the billing service.", "Then I ran the migration."), some with
  ``{"action_type": …}`` metadata, and chatter.
* **memory_access_log** — last-24 h events for ~10 % of semantic nodes (1 + Poisson(1.3): many
  with ≥ 2, some with exactly 1), some on working nodes, plus older events.  The frame carries
  ``tenant_id`` (a NOT NULL column of the store that the snapshot leaves out) and no ``id``.
* **procedural_skills** (active ``deploy_service``, draft ``run_migration``, archived),
  **prospective_triggers** (3), **soul_profiles** (``name``/``role`` on every other scope),
  **pending_connections** (``max(6, nodes // 100)``: resolvable, unresolvable, self-loops),
  **recall_events** (``max(10, nodes // 50)``, mostly unlabelled, some explicit feedback),
  **reranker_models** (one on every other scope).
* **Legacy rows** — ``legacy_rows`` extra nodes with ``scope_path`` NULL spread over the
  tenants, plus (for backfill tests) about one edge per node between legacy nodes of the same
  tenant and ``legacy_rows // 2`` legacy episodic events.

Ids are UUID-shaped (version nibble 8, "custom", RFC 9562) 128-bit values derived from
(seed, scope, table, index) by a splitmix64 mix, formatted to text without a Python loop.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pyarrow as pa

from deep_sleep.core.scope import SEP, Scope
from deep_sleep.core.tables import EMBEDDING_DIM, TABLES, columns

log = logging.getLogger(__name__)

__all__ = ["SeedSpec", "generate", "load", "scopes_of", "seed_store"]

_US = 1_000_000
_HOUR = 3600 * _US
_DAY = 24 * _HOUR
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# --------------------------------------------------------------------------------------------
# vocabularies (plain lowercase words: none contains a risk marker at a word start)

PREFIXES = (
    "project customer deploy incident preference meeting task bug feature release contact "
    "account invoice ticket policy team service database api config document note goal plan "
    "idea question decision event location product order payment vendor contract campaign "
    "report metric alert experiment model dataset pipeline schedule reminder travel health "
    "hobby family book recipe"
).split()

WORDS = (
    "alpha beta gamma delta billing checkout search onboarding mobile web backend frontend "
    "gateway cache queue worker cluster region europe asia america budget roadmap quarterly "
    "weekly monthly launch review sync standup retro hiring offsite training vendor partner "
    "pricing discount renewal upgrade migration rollout rollback hotfix patch schema index "
    "backup restore latency throughput uptime capacity storage network firewall login signup "
    "password reset email newsletter survey feedback support chat voice video coffee lunch "
    "dinner flight hotel train paris berlin tokyo london boston denver garden running yoga "
    "piano guitar chess novel poetry pasta curry salad bakery blue green orange purple "
    "morning evening friday monday summer winter spring autumn kitchen office remote hybrid "
    "laptop monitor keyboard printer router server ledger audit compliance privacy contract "
    "invoice refund shipping warehouse inventory supplier forecast dashboard report analytics"
).split()

# risk markers of phase 2 (with inflections that must match) and near misses that must not
MARKERS = (
    "risk risky danger dangerous failure failures loss losses negative decline declined "
    "warning warnings critical error errors threat threats Error CRITICAL Risk"
).split()
NEAR_MISSES = "terror asterisk brisket nonnegative".split()

RELATIONS = ("RELATED_TO", "CO_OCCURRED", "is", "lives_in", "works_at", "prefers", "CAUSES", "PART_OF")
_REL_P = (0.33, 0.17, 0.09, 0.06, 0.08, 0.08, 0.08, 0.11)

# (past verb, object, action_type)
ACTIONS = (
    ("deployed", "billing service", "deploy_service"),
    ("ran", "migration", "run_migration"),
    ("restarted", "worker pool", "restart_workers"),
    ("reviewed", "pull request", "review_pull_request"),
    ("updated", "customer record", "update_customer_record"),
    ("scheduled", "follow-up meeting", "schedule_meeting"),
    ("rotated", "api keys", "rotate_keys"),
    ("backed up", "database", "backup_database"),
    ("sent", "invoice", "send_invoice"),
    ("closed", "support ticket", "close_ticket"),
)

TENANT_NAMES = "acme globex initech umbrella hooli stark wayne wonka tyrell cyberdyne".split()
BRANDS = "core labs retail cloud".split()
STYLES = ("support", "sales")
PERSONAS = ("Nova", "Atlas", "Iris", "Sage", "Echo", "Orion", "Luna", "Juniper")
ROLES = ("customer support agent", "sales assistant", "onboarding guide", "research assistant")
PERSONALITIES = ("warm and concise", "playful", "formal and precise", "curious and patient")
COLORS = ("teal", "amber", "crimson", "indigo")


# --------------------------------------------------------------------------------------------
# the spec


@dataclass(frozen=True)
class SeedSpec:
    """What to generate.  ``now`` None means the wall clock truncated to the second, read once
    when the spec is built (so :func:`generate` stays a pure function of the spec)."""

    tenants: int = 3
    scopes_per_tenant: int = 2
    nodes_per_scope: int = 200
    seed: int = 7
    now: datetime | None = None
    days: int = 90
    embeddings: bool = False
    legacy_rows: int = 0

    def __post_init__(self) -> None:
        now = self.now
        if now is None:
            now = datetime.now(UTC).replace(microsecond=0)
        elif now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"SeedSpec.now must be timezone-aware (UTC), got naive {now!r}")
        object.__setattr__(self, "now", now.astimezone(UTC))
        for name in ("tenants", "nodes_per_scope", "days"):
            if getattr(self, name) < 1:
                raise ValueError(f"SeedSpec.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("scopes_per_tenant", "legacy_rows"):
            if getattr(self, name) < 0:
                raise ValueError(f"SeedSpec.{name} must be >= 0, got {getattr(self, name)}")


def _tenant_id(t: int) -> str:
    name = TENANT_NAMES[t % len(TENANT_NAMES)]
    return name if t < len(TENANT_NAMES) else f"{name}{t // len(TENANT_NAMES)}"


def _leaf(org: Scope, j: int) -> Scope:
    b = j // len(STYLES)
    brand = BRANDS[b % len(BRANDS)] + (str(b // len(BRANDS)) if b >= len(BRANDS) else "")
    return org.child("brand", brand).child("conversation", STYLES[j % len(STYLES)])


def scopes_of(spec: SeedSpec) -> list[Scope]:
    """Every scope that holds rows: per tenant the org scope, then its leaves."""
    out: list[Scope] = []
    for t in range(spec.tenants):
        org = Scope.root("org", _tenant_id(t))
        out.append(org)
        out.extend(_leaf(org, j) for j in range(spec.scopes_per_tenant))
    return out


def _nodes_in(spec: SeedSpec, scope: Scope) -> int:
    if scope.depth == 1 and spec.scopes_per_tenant > 0:
        return max(30, spec.nodes_per_scope // 10)
    return spec.nodes_per_scope


# --------------------------------------------------------------------------------------------
# vectorized helpers

_M64 = (1 << 64) - 1
# byte -> its two lowercase hex digits, as one little-endian uint16 (so a gather writes both)
_HEX = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), dtype="<u2").copy()


def _h64(*parts: object) -> int:
    text = "\x1e".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def _rng(*parts: object) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([_h64(*parts) & 0xFFFFFFFF, _h64(*parts) >> 32]))


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (a bijection of uint64), wrapping arithmetic."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _fixed_strings(mat: np.ndarray, name: str) -> pl.Series:
    """An (n, k) uint8 matrix of ASCII as a String series, zero-copy through Arrow buffers."""
    n, k = mat.shape
    data = np.ascontiguousarray(mat).reshape(-1)
    offsets = np.arange(0, (n + 1) * k, k, dtype=np.int64)
    arr = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
    return pl.Series(name, arr)


def _ids(seed: int, key: str, tag: str, count: int) -> pl.Series:
    """``count`` UUID-shaped ids derived from (seed, key, tag, index), as canonical text."""
    base_hi, base_lo = _h64(seed, key, tag, "hi"), _h64(seed, key, tag, "lo")
    idx = np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        hi = _mix64(idx * np.uint64(0x9E3779B97F4A7C15) + np.uint64(base_hi))
        lo = _mix64((idx ^ np.uint64(base_lo)) * np.uint64(0xD1B54A32D192ED03) + np.uint64(0x632BE59BD9B4E019))
    hi = (hi & np.uint64(_M64 ^ 0xF000)) | np.uint64(0x8000)  # version 8 (custom)
    lo = (lo & np.uint64(0x3FFFFFFFFFFFFFFF)) | np.uint64(0x8000000000000000)  # RFC variant
    raw = np.empty((count, 2), dtype=">u8")
    raw[:, 0], raw[:, 1] = hi, lo
    hexs = _HEX[raw.view(np.uint8).reshape(count, 16)].view(np.uint8)  # (count, 32) ASCII
    out = np.empty((count, 36), dtype=np.uint8)
    out[:, [8, 13, 18, 23]] = ord("-")
    out[:, 0:8], out[:, 9:13], out[:, 14:18] = hexs[:, 0:8], hexs[:, 8:12], hexs[:, 12:16]
    out[:, 19:23], out[:, 24:36] = hexs[:, 16:20], hexs[:, 20:32]
    return _fixed_strings(out, "id")


def _ts(us: np.ndarray, name: str) -> pl.Series:
    return pl.Series(name, np.asarray(us, dtype=np.int64)).cast(pl.Datetime("us", "UTC"))


def _pick(vocab: list[str] | tuple[str, ...], idx: np.ndarray) -> pl.Series:
    return pl.Series(list(vocab), dtype=pl.String).gather(np.asarray(idx, dtype=np.int64))


def _cat(*parts: str | pl.Series | pl.Expr) -> pl.Expr:
    """Concatenate literals (str) and columns (Series/Expr) row-wise."""
    return pl.concat_str([pl.lit(p) if isinstance(p, str) else p for p in parts])


def _when(mask: np.ndarray) -> pl.Expr:
    return pl.lit(pl.Series(mask, dtype=pl.Boolean))


def _zipf_p(k: int, s: float = 1.07) -> np.ndarray:
    p = 1.0 / np.arange(1, k + 1) ** s
    return p / p.sum()


def _unit_vectors(rng: np.random.Generator, n: int, centers: np.ndarray | None = None,
                  which: np.ndarray | None = None) -> np.ndarray:
    v = rng.standard_normal((n, EMBEDDING_DIM), dtype=np.float32)
    if centers is not None and which is not None:
        v *= np.float32(0.6)
        v += centers[which]
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def _emb_series(v: np.ndarray | None, n: int) -> pl.Series:
    dtype = pl.Array(pl.Float32, EMBEDDING_DIM)
    if v is None:
        return pl.Series("embedding", [None] * n, dtype=dtype)
    return pl.Series("embedding", v).cast(dtype)


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / _US, UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def _json_str(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


# --------------------------------------------------------------------------------------------
# one scope


@dataclass
class _Ctx:
    spec: SeedSpec
    scope_path: str | None  # None for legacy rows
    tenant_id: str
    key: str  # stable text identifying the scope (the path, or "legacy␟<tenant>")
    n: int
    now: int  # microseconds since the epoch
    legacy: bool

    def ids(self, tag: str, count: int) -> pl.Series:
        return _ids(self.spec.seed, self.key, tag, count)

    def rng(self, tag: str) -> np.random.Generator:
        return _rng(self.spec.seed, self.key, tag)

    def common(self, height: int) -> list[pl.Series]:
        return [
            pl.repeat(self.scope_path, height, dtype=pl.String, eager=True).alias("scope_path"),
            pl.repeat(self.tenant_id, height, dtype=pl.String, eager=True).alias("tenant_id"),
        ]


def _gen_nodes(c: _Ctx) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    rng = c.rng("nodes")
    now, days = c.now, c.spec.days
    horizon = days * _DAY
    specials = [] if c.legacy else _special_nodes(c)
    nb = c.n if c.legacy else max(0, c.n - len(specials))
    n_hot = 0 if c.legacy else min(6, nb)

    u = rng.random(nb)
    working = rng.random(nb) < 0.05
    working[:n_hot] = False
    semantic = ~working
    ordinary = np.arange(nb) >= n_hot
    recent = (rng.random(nb) < 0.15) & semantic  # updated within the last 24 h
    # every scope gets a few guaranteed phase-2 cases among its recent nodes: two marker labels,
    # a near miss, a marker only in a property value, and one marker node already tagged
    forced = np.zeros(0, dtype=np.int64)
    if not c.legacy:
        spare = np.flatnonzero(semantic & ~recent & ordinary)
        recent[spare[: max(0, 5 - int((recent & ordinary).sum()))]] = True
        forced = np.flatnonzero(recent & ordinary)[:5]

    # labels
    prefix = rng.choice(len(PREFIXES), nb, p=_zipf_p(len(PREFIXES)))
    w1 = rng.integers(0, len(WORDS), nb)
    w2 = rng.integers(0, len(WORDS), nb)
    r = rng.random(nb)
    word2 = _pick(WORDS, w2)
    marker_lab = (r < 0.03) & semantic
    near_lab = (r >= 0.03) & (r < 0.04) & semantic
    marker_lab[:n_hot] = near_lab[:n_hot] = False
    marker_lab[forced], near_lab[forced] = False, False
    marker_lab[forced[:2]] = True
    if len(forced) >= 3:
        near_lab[forced[2]] = True
    if len(forced) == 5:
        marker_lab[forced[4]] = True
    word2 = pl.select(
        pl.when(_when(marker_lab)).then(_pick(MARKERS, rng.integers(0, len(MARKERS), nb)))
        .when(_when(near_lab)).then(_pick(NEAR_MISSES, rng.integers(0, len(NEAR_MISSES), nb)))
        .otherwise(word2)
    ).to_series()
    colon = rng.random(nb) < 0.7
    num = rng.integers(2, 99, nb)
    has_num = rng.random(nb) < 0.4
    head = pl.when(_when(working)).then(pl.lit("thought: ")).otherwise(
        _cat(_pick(PREFIXES, prefix), pl.when(_when(colon)).then(pl.lit(": ")).otherwise(pl.lit(" ")))
    )
    tail = pl.when(_when(has_num)).then(_cat(" ", pl.Series(num).cast(pl.String))).otherwise(pl.lit(""))
    label = pl.select(_cat(head, _pick(WORDS, w1), " ", word2, tail)).to_series()

    # importance: a mixture
    imp = np.clip(np.round(rng.normal(6.2, 1.6, nb), 1), 1.0, 10.0)
    imp = np.where(u < 0.05, 10.0, imp)
    imp = np.where((u >= 0.05) & (u < 0.20), np.round(rng.uniform(1.0, 4.0, nb), 1), imp)
    imp = np.where((u >= 0.20) & (u < 0.25), 5.0, imp)
    imp = np.where((u >= 0.25) & (u < 0.27), 1.0, imp)
    imp[:n_hot] = 9.0
    access = rng.geometric(0.25, nb) - 1 + np.where(imp >= 8.0, 5, 0)

    # timestamps: bursts in the last 24 h, the rest denser towards now
    n_recent = int(recent.sum())
    bursts = max(3, n_recent // 8)
    centers = now - rng.integers(5 * 60 * _US, _DAY - 5 * 60 * _US, bursts)
    t_recent = centers[rng.integers(0, bursts, nb)] + (rng.normal(0.0, 240.0, nb) * _US).astype(np.int64)
    age_recent = np.clip(now - t_recent, _US, _DAY - _US)
    age_old = _DAY + ((horizon - _DAY) * rng.random(nb) ** 1.6).astype(np.int64)
    age_work = rng.integers(60 * _US, 96 * _HOUR, nb)
    age = np.where(working, age_work, np.where(recent, age_recent, age_old))
    updated = now - age
    floor = now - horizon
    same = rng.random(nb) < 0.35
    created = np.where(same, updated, updated - ((updated - floor) * rng.random(nb) ** 2).astype(np.int64))
    old30 = semantic & (age > 30 * _DAY)
    d = rng.random(nb)
    decayed_recent = old30 & (d < 0.25)
    decayed_older = old30 & (d >= 0.25) & (d < 0.5)
    last_decayed = np.where(
        decayed_recent, now - rng.integers(_US, _DAY, nb),
        np.where(decayed_older, now - rng.integers(_DAY, 20 * _DAY, nb), 0),
    )
    last_decayed = np.maximum(last_decayed, updated)
    ld_null = ~(decayed_recent | decayed_older)

    # properties
    ttl = np.array([1, 4, 24, 72])[rng.integers(0, 4, nb)]
    t = rng.random(nb)
    note_marker = rng.random(nb) < 0.06
    if len(forced) >= 4:
        t[forced[3]], note_marker[forced[3]] = 0.7, True  # the "note" template, with a marker
    note_word = pl.select(
        pl.when(_when(note_marker)).then(_pick(MARKERS, rng.integers(0, len(MARKERS), nb)))
        .when(_when(rng.random(nb) < 0.03)).then(_pick(NEAR_MISSES, rng.integers(0, len(NEAR_MISSES), nb)))
        .otherwise(_pick(WORDS, rng.integers(0, len(WORDS), nb)))
    ).to_series()
    w3 = _pick(WORDS, rng.integers(0, len(WORDS), nb))
    w4 = _pick(WORDS, rng.integers(0, len(WORDS), nb))
    conf = pl.Series(np.round(rng.uniform(0.5, 0.99, nb), 2)).cast(pl.String)
    ttl_s = pl.Series(ttl).cast(pl.String)
    tagged = marker_lab & recent & (rng.random(nb) < 0.2)
    tagged[forced[:2]] = False
    if len(forced) == 5:
        tagged[forced[4]] = True
    tagged_at = _iso(now - 3 * _DAY)
    chat = _cat('{"source": "chat", "confidence": ', conf, "}")
    props = pl.select(
        pl.when(_when(working & (t < 0.8)))
        .then(_cat('{"ttl_hours": ', ttl_s, ', "thought": "check ', w3, " ", w4, '"}'))
        .when(_when(working)).then(_cat('{"thought": "remember ', w3, '"}'))
        .when(_when(tagged)).then(pl.lit(f'{{"risk_node": true, "risk_tagged_at": "{tagged_at}", "source": "chat"}}'))
        .when(_when(~ordinary)).then(chat)
        .when(_when(t < 0.25)).then(pl.lit("{}"))
        .when(_when(t < 0.60)).then(chat)
        .when(_when(t < 0.85)).then(_cat('{"note": "', w3, " ", note_word, '", "source": "import"}'))
        .when(_when(t < 0.98)).then(_cat('{"tags": ["', w3, '", "', w4, '"], "pinned": false}'))
        .otherwise(_cat('{"ttl_hours": ', ttl_s, ', "source": "tool"}'))
    ).to_series()

    emb = None
    if c.spec.embeddings:
        erng = c.rng("node-embeddings")
        pcenters = _unit_vectors(erng, len(PREFIXES))
        emb = _unit_vectors(erng, nb, pcenters, prefix)

    df = pl.DataFrame([
        *c.common(nb),
        pl.Series("layer", np.where(working, "working", "semantic")).cast(pl.String),
        label.alias("label"),
        props.alias("properties"),
        pl.Series("importance", imp.astype(np.float64)),
        pl.Series("access_count", access.astype(np.int64)),
        _ts(created, "created_at"),
        _ts(updated, "updated_at"),
        _ts(last_decayed, "last_decayed_at"),
        pl.Series("version", (1 + rng.geometric(0.6, nb) - 1).astype(np.int64)),
    ]).with_columns(pl.when(_when(ld_null)).then(None).otherwise(pl.col("last_decayed_at")).alias("last_decayed_at"))
    if c.spec.embeddings:
        df = df.with_columns(_emb_series(emb, nb))

    if specials:
        sp = pl.DataFrame(specials, schema={
            "layer": pl.String, "label": pl.String, "properties": pl.String, "importance": pl.Float64,
            "access_count": pl.Int64, "created_at": pl.Int64, "updated_at": pl.Int64,
        }, orient="row")
        m = sp.height
        sp = pl.DataFrame([
            *c.common(m), sp["layer"], sp["label"], sp["properties"], sp["importance"], sp["access_count"],
            _ts(sp["created_at"].to_numpy(), "created_at"), _ts(sp["updated_at"].to_numpy(), "updated_at"),
            pl.Series("last_decayed_at", [None] * m, dtype=pl.Datetime("us", "UTC")),
            pl.Series("version", [2] * m, dtype=pl.Int64),
        ])
        if c.spec.embeddings:
            sp = sp.with_columns(_emb_series(_unit_vectors(c.rng("special-embeddings"), m), m))
        df = pl.concat([df, sp], how="vertical")
        updated = np.concatenate([updated, sp["updated_at"].dt.epoch("us").to_numpy()])
        created = np.concatenate([created, sp["created_at"].dt.epoch("us").to_numpy()])
        working = np.concatenate([working, np.zeros(m, dtype=bool)])
        recent = np.concatenate([recent, np.zeros(m, dtype=bool)])
        imp = np.concatenate([imp, sp["importance"].to_numpy()])

    total = df.height
    df = df.with_columns(c.ids("memory_nodes", total).alias("id"))
    info = {
        "updated": updated, "created": created, "working": working, "recent": recent,
        "bulk": np.arange(total) < nb, "hot": np.arange(total) < n_hot, "importance": imp,
    }
    return df, info


def _special_nodes(c: _Ctx) -> list[tuple]:
    """Protected nodes (SOUL edits, recent; AGENT_IDENTITY facts) and one expired thinking note."""
    rng = c.rng("special")
    now = c.now
    h = _h64(c.spec.seed, c.key)
    persona = PERSONAS[h % len(PERSONAS)]
    old_persona = PERSONAS[(h + 1) % len(PERSONAS)]

    def soul(value: str) -> str:
        return f'{{"_last_edited_by": "user_manual_edit", "value": "{_json_str(value)}"}}'

    def ago(lo_h: float, hi_h: float) -> int:
        return now - int(rng.uniform(lo_h, hi_h) * _HOUR)

    rows = []
    t_old_name = ago(14, 20)
    rows.append(("semantic", "SOUL:name", soul(old_persona), 7.0, 3, t_old_name - 40 * _DAY, t_old_name))
    for label, value, imp in (
        ("SOUL:name", persona, 9.0),
        ("SOUL:role", ROLES[h % len(ROLES)], 8.5),
        ("SOUL:personality", PERSONALITIES[(h >> 8) % len(PERSONALITIES)], 6.0),
        ("SOUL:favorite_color", COLORS[(h >> 16) % len(COLORS)], 2.0),
    ):
        t = ago(0.5, 12)
        rows.append(("semantic", label, soul(value), imp, 4, t - 30 * _DAY, t))
    t = ago(30 * 24, 40 * 24)
    mission = '{"value": "help customers succeed"}'
    rows.append(("semantic", "AGENT_IDENTITY:mission", mission, 9.5, 12, t - 10 * _DAY, t))
    t = ago(50 * 24, 60 * 24)
    rows.append(("semantic", "AGENT_IDENTITY:core_values", '{"value": "honesty, care"}', 2.0, 0, t - _DAY, t))
    # every scope has at least one thinking note whose 24 h TTL has run out (phase 8 has work)
    t = ago(30, 40)
    rows.append(("working", "note: scratch from an earlier turn", '{"ttl_hours": 24, "kind": "thinking"}', 3.0, 0, t, t))
    horizon = now - c.spec.days * _DAY
    return [(*r[:5], max(r[5], horizon), max(r[6], horizon)) for r in rows]


def _gen_edges(c: _Ctx, nodes: pl.DataFrame, info: dict[str, np.ndarray]) -> pl.DataFrame:
    rng = c.rng("edges")
    now = c.now
    sem = np.flatnonzero(info["bulk"] & ~info["working"])
    ns = len(sem)
    if ns < 2:
        return pl.DataFrame()
    # functional groups: one source, 2-3 targets, one relation (is / lives_in)
    f = max(2, ns // 40)
    fsrc = sem[rng.choice(ns, min(f, ns), replace=False)]
    k = rng.integers(2, 4, len(fsrc))
    g_src = np.repeat(fsrc, k)
    g_rel = np.repeat(np.where(rng.random(len(fsrc)) < 0.5, RELATIONS.index("is"), RELATIONS.index("lives_in")), k)
    g_tgt = sem[rng.integers(0, ns, len(g_src))]

    # CO_OCCURRED edges between recent nodes close in time (phase 1.5 reinforces them)
    rec = np.flatnonzero(info["recent"] & info["bulk"])
    rec = rec[np.argsort(info["updated"][rec], kind="stable")]
    close = np.flatnonzero(np.diff(info["updated"][rec]) <= 900 * _US)
    close = close[rng.random(len(close)) < 0.3]
    flip = rng.random(len(close)) < 0.5
    c_src = np.where(flip, rec[close + 1], rec[close])
    c_tgt = np.where(flip, rec[close], rec[close + 1])

    # the rest: uniform sources, targets half uniform and half hub-skewed (density ~ rank^-2/3),
    # so some nodes are hubs and many have at most one neighbour
    m = max(0, int(round(1.5 * nodes.height * 1.01)) - len(g_src) - len(c_src))
    r_src = sem[rng.integers(0, ns, m)]
    perm = rng.permutation(ns)
    hub = rng.random(m) < 0.45
    rank = np.minimum((ns * rng.random(m) ** 3).astype(np.int64), ns - 1)
    r_tgt = np.where(hub, sem[perm[rank]], sem[rng.integers(0, ns, m)])
    r_rel = rng.choice(len(RELATIONS), m, p=_REL_P)

    src = np.concatenate([g_src, c_src, r_src])
    tgt = np.concatenate([g_tgt, c_tgt, r_tgt])
    rel = np.concatenate([g_rel, np.full(len(c_src), RELATIONS.index("CO_OCCURRED")), r_rel])
    kind = np.concatenate([np.ones(len(g_src), np.int8), np.full(len(c_src), 2, np.int8), np.zeros(m, np.int8)])
    keep = src != tgt
    src, tgt, rel, kind = src[keep], tgt[keep], rel[keep], kind[keep]
    key = (src.astype(np.int64) * nodes.height + tgt) * len(RELATIONS) + rel
    _, first = np.unique(key, return_index=True)
    first.sort()
    src, tgt, rel, kind = src[first], tgt[first], rel[first], kind[first]
    e = len(src)

    created_n = info["created"]
    base = np.maximum(created_n[src], created_n[tgt])
    created = base + ((now - base) * rng.random(e) ** 0.7).astype(np.int64)
    # crafted co-occurrence edges were made when both ends were last touched
    co = kind == 2
    created = np.where(co, np.minimum(info["updated"][src], info["updated"][tgt]) - _HOUR, created)
    created = np.maximum(created, base)
    upd = np.where(rng.random(e) < 0.3, created + ((now - created) * rng.random(e)).astype(np.int64), created)
    w = np.where(rel == 0, np.round(rng.uniform(0.1, 3.0, e), 2),
                 np.where(rel == 1, rng.integers(1, 6, e).astype(np.float64),
                          np.where(rng.random(e) < 0.7, 1.0, np.round(rng.uniform(0.5, 1.5, e), 2))))
    p = rng.random(e)
    props = pl.select(
        pl.when(_when(co)).then(pl.lit('{"source": "cooccurrence"}'))
        .when(_when(p < 0.7)).then(pl.lit("{}"))
        .when(_when(p < 0.9)).then(pl.lit('{"source": "chat"}'))
        .otherwise(_cat('{"confidence": ', pl.Series(np.round(rng.uniform(0.3, 0.99, e), 2)).cast(pl.String), "}"))
    ).to_series()
    node_ids = nodes["id"]
    return pl.DataFrame([
        c.ids("memory_edges", e),
        *c.common(e),
        node_ids.gather(src).alias("source_id"),
        node_ids.gather(tgt).alias("target_id"),
        _pick(RELATIONS, rel).alias("relation"),
        pl.Series("weight", w.astype(np.float64)),
        props.alias("properties"),
        _ts(created, "created_at"),
        _ts(upd, "updated_at"),
        _ts(created, "valid_from"),
        pl.Series("valid_to", [None] * e, dtype=pl.Datetime("us", "UTC")),
        pl.Series("version", (rng.geometric(0.7, e)).astype(np.int64)),
    ])


def _gen_episodic(c: _Ctx, nodes: pl.DataFrame, info: dict[str, np.ndarray]) -> pl.DataFrame:
    rng = c.rng("episodic")
    now, horizon = c.now, c.spec.days * _DAY
    count = max(60, c.n // 2) if c.legacy else max(120, c.n // 5)
    hot_labels = nodes["label"].filter(pl.Series(info["hot"])).to_list()
    cat_p = np.array([0.30, 0.08, 0.02, 0.28, 0.32])  # markers, soul, ghost marker, action, chatter
    if len(hot_labels) < 2 or c.legacy:
        cat_p[:3] = 0.0
    cat = rng.choice(5, count, p=cat_p / cat_p.sum())

    # times: half in the last 7 days (markers 80 %), a quarter in 7-30 days, the rest older
    band = rng.choice(3, count, p=(0.5, 0.25, 0.25))
    band = np.where((cat == 0) & (rng.random(count) < 0.8), 0, band)
    lo = np.array([60 * _US, 7 * _DAY, 30 * _DAY])[band]
    hi = np.minimum(np.array([7 * _DAY, 30 * _DAY, horizon])[band], horizon)
    lo = np.minimum(lo, hi - 1)
    age = lo + ((hi - lo) * rng.random(count)).astype(np.int64)
    order = np.argsort(-age, kind="stable")  # chronological
    cat, age = cat[order], age[order]
    created = now - age

    # marker content: a few hot pairs, Zipf-weighted, so pairs repeat
    nh = len(hot_labels)
    pairs = [(0, 1), (0, 2), (1, 2), (3, 4), (2, 5), (1, 4)]
    pairs = [(a, b) for a, b in pairs if a < nh and b < nh] or [(0, 0)]
    pi = rng.choice(len(pairs), count, p=_zipf_p(len(pairs), 1.2))
    pa_, pb_ = np.array(pairs)[pi].T
    hot = hot_labels or [""]
    la, lb = _pick(hot, pa_), _pick(hot, pb_)
    act = rng.choice(len(ACTIONS), count, p=_zipf_p(len(ACTIONS), 1.3))
    verb = _pick([a[0] for a in ACTIONS], act)
    obj = _pick([a[1] for a in ACTIONS], act)
    atype = _pick([a[2] for a in ACTIONS], act)
    tmpl = rng.integers(0, 3, count)
    w1 = _pick(WORDS, rng.integers(0, len(WORDS), count))
    w2 = pl.select(
        pl.when(_when(rng.random(count) < 0.05)).then(_pick(MARKERS, rng.integers(0, len(MARKERS), count)))
        .otherwise(_pick(WORDS, rng.integers(0, len(WORDS), count)))
    ).to_series()
    pre = _pick(PREFIXES, rng.integers(0, len(PREFIXES), count))
    content = pl.select(
        pl.when(_when((cat == 0) & (tmpl == 0)))
        .then(_cat("User asked about [semantic:", la, "] while discussing [semantic:", lb, "]."))
        .when(_when(cat == 0))
        .then(_cat("Linked [semantic:", la, "] with [semantic:", lb, "] for the ", w1, " follow-up."))
        .when(_when(cat == 1)).then(_cat("[SOUL:name] greeted the user and recalled [semantic:", la, "]."))
        .when(_when(cat == 2)).then(_cat("Mentioned [semantic:ghost ", w1, "] which nobody remembers."))
        .when(_when((cat == 3) & (tmpl == 0))).then(_cat("I ", verb, " the ", obj, "."))
        .when(_when((cat == 3) & (tmpl == 1))).then(_cat("Then I ", verb, " the ", obj, "."))
        .when(_when(cat == 3)).then(_cat("First I checked the status dashboard, then I ", verb, " the ", obj, "."))
        .otherwise(_cat("Talked about ", w1, " ", w2, " for the ", pre, " review."))
    ).to_series()
    mr = rng.random(count)
    turn = pl.Series(rng.integers(1, 40, count)).cast(pl.String)
    metadata = pl.select(
        pl.when(_when((cat == 3) & (mr < 0.4))).then(_cat('{"action_type": "', atype, '"}'))
        .when(_when(mr < 0.3)).then(pl.lit("{}"))
        .when(_when(mr < 0.8)).then(_cat('{"channel": "chat", "turn": ', turn, "}"))
        .otherwise(pl.lit('{"channel": "voice"}'))
    ).to_series()
    sessions = 36
    sess_names = [f"sess-{_h64(c.spec.seed, c.key, 'session') & 0xFFFFFF:06x}-{k:02d}" for k in range(sessions)]
    sess = _pick(sess_names, np.arange(count) * sessions // count)
    df = pl.DataFrame([
        c.ids("episodic_events", count),
        *c.common(count),
        sess.alias("session_id"),
        content.alias("content"),
        metadata.alias("metadata"),
        _ts(created, "created_at"),
        pl.Series("version", np.ones(count, dtype=np.int64)),
    ])
    if c.spec.embeddings:
        df = df.with_columns(_emb_series(_unit_vectors(c.rng("episodic-embeddings"), count), count))
    return df


def _gen_access(c: _Ctx, nodes: pl.DataFrame, info: dict[str, np.ndarray]) -> pl.DataFrame:
    rng = c.rng("access")
    now, horizon = c.now, c.spec.days * _DAY
    total = nodes.height
    sem = ~info["working"]
    r = rng.random(total)
    recent_pick = np.flatnonzero(sem & (r < 0.10))
    k_recent = 1 + rng.poisson(1.3, len(recent_pick))
    work_pick = np.flatnonzero(info["working"] & (r < 0.10))
    old_pick = np.flatnonzero(rng.random(total) < 0.15)
    k_old = rng.integers(1, 4, len(old_pick))
    n_r = np.repeat(recent_pick, k_recent)
    n_w = np.repeat(work_pick, 2)
    n_o = np.repeat(old_pick, k_old)
    t_r = now - rng.integers(_US, _DAY - _US, len(n_r) + len(n_w))
    t_o = now - rng.integers(_DAY, max(horizon, _DAY + 1), len(n_o))
    node = np.concatenate([n_r, n_w, n_o])
    at = np.maximum(np.concatenate([t_r, t_o]), info["created"][node])
    order = np.lexsort((node, at))
    node, at = node[order], at[order]
    e = len(node)
    return pl.DataFrame([
        *c.common(e),
        nodes["id"].gather(node).alias("node_id"),
        _ts(at, "accessed_at"),
        pl.Series("kind", np.where(rng.random(e) < 0.75, "read", "write")).cast(pl.String),
    ])


def _gen_small(c: _Ctx, nodes: pl.DataFrame, info: dict[str, np.ndarray], index: int) -> dict[str, pl.DataFrame]:
    """The small per-scope tables (a few rows each, up to ~n/50 for recall events)."""
    rng = c.rng("small")
    now = c.now
    ts = pl.Datetime("us", "UTC")
    out: dict[str, pl.DataFrame] = {}

    # procedural skills
    skills = [
        ("deploy service", "Deploy the billing service safely", '["check the build", "deploy", "verify health"]',
         "active", "user", "deploy_service", 7),
        ("run migration", "Run the database migration", '["back up the database", "run the migration"]',
         "draft", "consolidation", "run_migration", 3),
        ("send weekly report", "Send the weekly report", '["collect metrics", "send email"]',
         "archived", "agent", None, 1),
    ]
    m = len(skills)
    created = now - rng.integers(10 * _DAY, 60 * _DAY, m)
    df = pl.DataFrame(skills, schema=["name", "description", "steps", "status", "source", "pattern_key", "occurrences"],
                      orient="row")
    out["procedural_skills"] = pl.DataFrame([
        c.ids("procedural_skills", m), *c.common(m), *df.iter_columns(),
        _emb_series(_unit_vectors(c.rng("skill-embeddings"), m) if c.spec.embeddings else None, m),
        _ts(created, "created_at"), _ts(created + rng.integers(0, 5 * _DAY, m), "updated_at"),
        pl.Series("version", [1] * m, dtype=pl.Int64),
    ]).with_columns(pl.col("occurrences").cast(pl.Int64))

    # prospective triggers
    trig = [
        ("when the user mentions the renewal", "remind about the discount offer", now - 2 * _HOUR, "pending"),
        ("every friday morning", "send the weekly summary", now + 3 * _DAY, "pending"),
        ("after the billing deploy", "check the error dashboard", now - 5 * _DAY, "fired"),
    ]
    m = len(trig)
    tc = np.array([t[2] for t in trig]) - 6 * _DAY
    out["prospective_triggers"] = pl.DataFrame([
        c.ids("prospective_triggers", m), *c.common(m),
        pl.Series("condition", [t[0] for t in trig]), pl.Series("action", [t[1] for t in trig]),
        _ts(np.array([t[2] for t in trig]), "due_at"), pl.Series("status", [t[3] for t in trig]),
        _ts(tc, "created_at"), _ts(tc, "updated_at"), pl.Series("version", [1] * m, dtype=pl.Int64),
    ])

    # soul profiles on every other scope
    if index % 2 == 0:
        h = _h64(c.spec.seed, c.key)
        kv = [("name", PERSONAS[(h + 3) % len(PERSONAS)]), ("role", ROLES[(h + 1) % len(ROLES)])]
        m = len(kv)
        out["soul_profiles"] = pl.DataFrame([
            c.ids("soul_profiles", m), *c.common(m),
            pl.Series("key", [k for k, _ in kv]), pl.Series("value", [v for _, v in kv]),
            _ts(now - rng.integers(2 * _DAY, 20 * _DAY, m), "updated_at"),
            pl.Series("version", [1] * m, dtype=pl.Int64),
        ])

    # pending connections: resolvable, unresolvable, self-loops
    sem = np.flatnonzero(info["bulk"] & ~info["working"])
    labels = nodes["label"]
    if len(sem):
        m = max(6, c.n // 100)
        s_lab = labels.gather(sem[rng.integers(0, len(sem), m)])
        t_lab = labels.gather(sem[rng.integers(0, len(sem), m)])
        r = rng.random(m)
        r[0], r[1] = 0.05, 0.2  # at least one unresolvable and one self-loop
        ghost = pl.concat_str([pl.lit("ghost: "), _pick(WORDS, rng.integers(0, len(WORDS), m))], separator="")
        t_lab = pl.select(pl.when(_when(r < 0.15)).then(ghost).when(_when(r < 0.25)).then(s_lab).otherwise(t_lab))
        t_lab = t_lab.to_series()
        out["pending_connections"] = pl.DataFrame([
            c.ids("pending_connections", m), *c.common(m),
            s_lab.alias("source_label"), t_lab.alias("target_label"),
            _pick(RELATIONS, rng.choice(len(RELATIONS), m, p=_REL_P)).alias("relation"),
            pl.Series("weight", np.round(rng.uniform(0.5, 2.0, m), 2)),
            _ts(now - rng.integers(_US, _DAY, m), "created_at"),
            pl.Series("consumed_by_run", [None] * m, dtype=pl.String),
            pl.Series("outcome", [None] * m, dtype=pl.String),
            pl.Series("version", [1] * m, dtype=pl.Int64),
        ])

        # recall events: 12 features, mostly unlabelled, some explicit feedback
        m = max(10, c.n // 50)
        feats = np.round(rng.random((m, 12)), 4)
        sim = np.round(rng.uniform(0.3, 0.95, m), 4)
        fb = rng.random(m)
        label = np.where(fb < 0.1, 1.0, 0.0)
        explicit = fb < 0.2
        q = pl.concat_str([pl.lit("what about "), _pick(WORDS, rng.integers(0, len(WORDS), m)), pl.lit(" "),
                           _pick(WORDS, rng.integers(0, len(WORDS), m))])
        out["recall_events"] = pl.DataFrame([
            c.ids("recall_events", m), *c.common(m),
            pl.select(q).to_series().alias("query"),
            nodes["id"].gather(sem[rng.integers(0, len(sem), m)]).alias("node_id"),
            pl.Series("similarity", sim),
            pl.Series("features", feats).cast(pl.List(pl.Float64)),
            pl.Series("score", np.round(sim + rng.normal(0, 0.05, m), 4)),
            pl.Series("label", label).set(pl.Series(~explicit), None),
            pl.Series("label_source", ["explicit"] * m, dtype=pl.String).set(pl.Series(~explicit), None),
            pl.Series("trained_at", [None] * m, dtype=ts),
            _ts(now - rng.integers(_US, 48 * _HOUR, m), "created_at"),
            pl.Series("version", [1] * m, dtype=pl.Int64),
        ])

    # a reranker on every other scope
    if index % 2 == 1:
        out["reranker_models"] = pl.DataFrame([
            c.ids("reranker_models", 1), *c.common(1),
            pl.Series("weights", [np.round(rng.normal(0, 0.1, 12), 4).tolist()], dtype=pl.List(pl.Float64)),
            pl.Series("bias", [0.01]), pl.Series("steps", [int(rng.integers(1, 30))], dtype=pl.Int64),
            _ts(np.array([now - 2 * _DAY]), "updated_at"), pl.Series("version", [1], dtype=pl.Int64),
        ])
    return out


# --------------------------------------------------------------------------------------------
# public API


def _frame_columns(table: str, embeddings: bool) -> list[tuple[str, pl.DataType]]:
    cols = [(col.name, col.dtype) for col in TABLES[table] if not (table == "memory_access_log" and col.name == "id")]
    if table == "memory_access_log":
        cols.insert(1, ("tenant_id", pl.String()))  # NOT NULL in the store; not in the snapshot
    if embeddings and table in ("memory_nodes", "episodic_events"):
        cols.append(("embedding", pl.Array(pl.Float32, EMBEDDING_DIM)))
    return cols


def _shape(table: str, parts: list[pl.DataFrame], embeddings: bool) -> pl.DataFrame:
    cols = _frame_columns(table, embeddings)
    parts = [p for p in parts if p.height]
    if not parts:
        return pl.DataFrame(schema=dict(cols))
    df = pl.concat([p.select([pl.col(n).cast(t) for n, t in cols]) for p in parts], how="vertical", rechunk=True)
    return df


def generate(spec: SeedSpec) -> dict[str, pl.DataFrame]:
    """All tables of a synthetic store for ``spec``; a pure function (same spec, equal frames).

    Frames carry the snapshot columns of :data:`deep_sleep.core.tables.TABLES` (memory_access_log:
    without ``id``, plus ``tenant_id``); with ``spec.embeddings``, memory_nodes and
    episodic_events also carry ``embedding`` (fixed-size float32 unit vectors).
    """
    now = (spec.now - _EPOCH) // timedelta(microseconds=1)
    parts: dict[str, list[pl.DataFrame]] = {t: [] for t in TABLES}
    for index, scope in enumerate(scopes_of(spec)):
        c = _Ctx(spec, scope.path, scope.tenant_id, scope.path, _nodes_in(spec, scope), now, legacy=False)
        nodes, info = _gen_nodes(c)
        parts["memory_nodes"].append(nodes)
        parts["memory_edges"].append(_gen_edges(c, nodes, info))
        parts["episodic_events"].append(_gen_episodic(c, nodes, info))
        parts["memory_access_log"].append(_gen_access(c, nodes, info))
        for table, df in _gen_small(c, nodes, info, index).items():
            parts[table].append(df)
    if spec.legacy_rows:
        for t in range(spec.tenants):
            n = spec.legacy_rows // spec.tenants + (1 if t < spec.legacy_rows % spec.tenants else 0)
            if not n:
                continue
            tid = _tenant_id(t)
            c = _Ctx(spec, None, tid, f"legacy{SEP}{tid}", n, now, legacy=True)
            nodes, info = _gen_nodes(c)
            parts["memory_nodes"].append(nodes)
            edges = _gen_edges(c, nodes, info)
            if edges.height:
                parts["memory_edges"].append(edges.head(n))
            parts["episodic_events"].append(_gen_episodic(c, nodes, info).head(max(1, n // 2)))
    return {t: _shape(t, parts[t], spec.embeddings) for t in TABLES}


# Below this many rows (or into a table that already has rows) the loader inserts through the
# live indexes; above it, into an empty table, it drops the table's indexes and unique/primary
# constraints inside the load transaction and rebuilds them from their own definitions after
# the insert -- 3-5x faster at a million rows (index builds sort once instead of inserting
# randomly ordered uuids into four b-trees).  Nobody sees the table without its indexes: the
# DDL holds an ACCESS EXCLUSIVE lock until commit, and a rollback restores everything.
REBUILD_MIN_ROWS = 100_000


def _fetch(cur, sql: str) -> list[tuple]:
    cur.execute(sql)
    return list(cur.fetchall())


def _detach_indexes(cur, table: str) -> list[str] | None:
    """Drop ``table``'s indexes and primary/unique constraints; return the DDL that restores them.

    None (nothing dropped) when the table has rows or is referenced by a foreign key.  Takes the
    ACCESS EXCLUSIVE lock first, so two concurrent bulk loads queue instead of deadlocking on a
    lock upgrade.
    """
    cur.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    if _fetch(cur, f"SELECT 1 FROM {table} LIMIT 1"):
        return None
    if _fetch(cur, f"SELECT 1 FROM pg_constraint WHERE confrelid = '{table}'::regclass"):
        return None
    cons = _fetch(cur, f"""
        SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE conrelid = '{table}'::regclass AND contype IN ('p', 'u') ORDER BY conname""")
    idx = _fetch(cur, f"""
        SELECT c.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
        WHERE x.indrelid = '{table}'::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid)
        ORDER BY c.relname""")
    for name, _ in idx:
        cur.execute(f'DROP INDEX "{name}"')
    for name, _ in cons:
        cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    return [f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {ddl}' for name, ddl in cons] + [ddl for _, ddl in idx]


def load(store, frames: dict[str, pl.DataFrame]) -> dict[str, int]:
    """Bulk-insert ``frames`` (as from :func:`generate`) into ``store`` in one transaction.

    Each frame is staged through ADBC into a temporary table (uuid/json as text, embeddings as
    ``list<float32>``), then moved with one ``INSERT … SELECT`` that applies
    :meth:`Column.cast_sql`.  Columns are taken from the frame, so a frame may leave out
    columns that have defaults.  Large loads into empty tables rebuild the indexes afterwards
    (see ``REBUILD_MIN_ROWS``).  Returns rows inserted per table (every table of the input).
    """
    counts: dict[str, int] = {}
    with store.transaction() as cur:
        cur.execute("DISCARD TEMP")  # staging tables an earlier load, apply or undo left on this pooled connection
        cur.execute("SET LOCAL maintenance_work_mem = '256MB'")
        for table, df in frames.items():
            if table not in TABLES:
                raise KeyError(f"load: unknown table {table!r}; Deep Sleep knows {', '.join(TABLES)}")
            if df.height == 0:
                counts[table] = 0
                continue
            known = columns(table)
            stage_cols, selects = [], []
            for name in df.columns:
                col = known.get(name)
                if name == "embedding" or (col is not None and col.kind == "vector"):
                    stage_cols.append(pl.col(name).cast(pl.List(pl.Float32)))
                    selects.append(f'"{name}"::real[]::vector')
                else:
                    stage_cols.append(pl.col(name))
                    selects.append(col.cast_sql(f'"{name}"') if col is not None else f'"{name}"')
            t0 = time.perf_counter()
            stage = f"_ds_seed_{table}"
            data = df.select(stage_cols).to_arrow(compat_level=pl.CompatLevel.oldest())
            cur.adbc_ingest(stage, data, mode="create", temporary=True)
            del data
            t1 = time.perf_counter()
            restore = _detach_indexes(cur, table) if df.height >= REBUILD_MIN_ROWS else None
            cols_sql = ", ".join(f'"{c}"' for c in df.columns)
            cur.execute(f'INSERT INTO {table} ({cols_sql}) SELECT {", ".join(selects)} FROM "{stage}"')
            counts[table] = cur.rowcount if cur.rowcount is not None and cur.rowcount >= 0 else df.height
            cur.execute(f'DROP TABLE "{stage}"')
            t2 = time.perf_counter()
            for ddl in restore or ():
                cur.execute(ddl)
            log.debug("seed load %s: %d rows, stage %.2fs, insert %.2fs, index rebuild %s", table, df.height,
                      t1 - t0, t2 - t1, f"{time.perf_counter() - t2:.2f}s" if restore else "no")
    return counts


def seed_store(store, spec: SeedSpec) -> dict[str, int]:
    """Generate ``spec`` and load it into ``store``; rows per table."""
    return load(store, generate(spec))
