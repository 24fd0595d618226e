"""A fleet of many small scopes, generated in one vectorized pass and bulk-loaded (issue 12's benchmark).

A fleet is ``scopes`` leaf scopes ``org/<tenant>/agent/<agent>`` of ``nodes`` nodes each, 20 to a
tenant.  Generating 100,000 scopes one by one with :func:`deep_sleep.dev.seed.generate` would
take a Python loop per scope (~10 ms each); instead :func:`generate_fleet` builds ``templates``
distinct scopes with that generator (each one a realistic scope in which every phase has work,
see :mod:`deep_sleep.dev.seed`) and replicates them across the fleet with numpy gathers: scope
``i`` is a copy of template ``i % templates`` with its own scope path, tenant and ids (UUID-shaped,
derived from (seed, table, scope index, row index) by a splitmix64 mix, so no two scopes share an
id), and foreign keys (edge ends, access-log and recall node ids) remapped to the copy's ids.

    >>> frames = generate_fleet(FleetSpec(scopes=3, nodes=40, templates=2, now=datetime(2026, 1, 1, tzinfo=UTC)))
    >>> frames["memory_nodes"]["scope_path"].n_unique()
    3
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl

from deep_sleep.core.config import GateConfig
from deep_sleep.core.embedding import embedder
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.core.tables import EMBEDDING_DIM, TABLES, conform
from deep_sleep.dev.arrays import _HOUR, _h64, _mix64, _rng, _uuid_text
from deep_sleep.dev.errors import SeedError
from deep_sleep.dev.seed import SeedSpec, generate, load
from deep_sleep.run.gate import ranked_hits

log = logging.getLogger(__name__)

# uuid columns that point at a node of the same scope
_NODE_REFS = {"memory_edges": ("source_id", "target_id"), "memory_access_log": ("node_id",),
              "recall_events": ("node_id",)}
SCOPES_PER_TENANT = 20
RECALL_K = 5  # the live recall's default k: hits logged per query
_PROTECTED = ("SOUL:", "AGENT_IDENTITY:", "META:")


@dataclass(frozen=True)
class FleetSpec:
    """What fleet to build.  ``now`` None: the wall clock truncated to the second, read once.

    recalls: the store as the live path writes it — every node, event and skill with the vector of
        ``embedding_model`` (and the model's name), and realistic recall events with explicit feedback
        (module docstring); off, nothing has a vector and the recall events are the seed generator's.
    recall_queries: queries per scope (with ``recalls``); ``feedback_share``: the share of each
        scope's queries that have explicit feedback (the ``max(1, round(share × queries))`` of a
        splitmix64 draw of (seed, scope, query); none at 0)."""

    scopes: int = 1000
    nodes: int = 100
    templates: int = 16
    seed: int = 11
    now: datetime | None = None
    recalls: bool = False
    recall_queries: int = 20
    feedback_share: float = 0.1
    embedding_model: str = "hashing"

    def __post_init__(self) -> None:
        if self.now is None:
            object.__setattr__(self, "now", datetime.now(UTC).replace(microsecond=0))
        for name in ("scopes", "nodes", "templates", "recall_queries"):
            if getattr(self, name) < 1:
                raise SeedError(f"FleetSpec.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.feedback_share <= 1.0:
            raise SeedError(f"FleetSpec.feedback_share must be within [0, 1], got {self.feedback_share}")


def fleet_scope(index: int) -> Scope:
    """The ``index``-th scope of a fleet: ``org/f<tenant>/agent/a<index>``."""
    return Scope.root("org", f"f{index // SCOPES_PER_TENANT:06d}").child("agent", f"a{index:07d}")


def fleet_scopes(spec: FleetSpec) -> list[Scope]:
    return [fleet_scope(i) for i in range(spec.scopes)]


def _scope_columns(n_scopes: int) -> tuple[pl.Series, pl.Series]:
    """(scope_path, tenant_id) of scopes 0..n-1, built without a Python loop per scope."""
    idx = pl.Series("i", np.arange(n_scopes, dtype=np.int64))
    tenant = pl.select(pl.lit("f") + (idx // SCOPES_PER_TENANT).cast(pl.String).str.zfill(6)).to_series()
    path = pl.select(pl.lit("org\x1f") + tenant + pl.lit("\x1fagent\x1fa") + idx.cast(pl.String).str.zfill(7)).to_series()
    return path.alias("scope_path"), tenant.alias("tenant_id")


def _uuids(seed: int, table: str, scope: np.ndarray, row: np.ndarray) -> pl.Series:
    """UUID-shaped text ids of (scope index, row index) pairs: distinct pairs give distinct ids.

    The low word holds ``scope << 24 | row`` as it is (so ids of one table never collide; rows
    < 2^24, scopes < 2^38) under the RFC variant bits; the high word is a splitmix64 mix of it and
    the table (random-looking ids, as the store's own, and distinct across tables)."""
    s, r = scope.astype(np.uint64), row.astype(np.uint64)
    key = (s << np.uint64(24)) | r
    with np.errstate(over="ignore"):
        hi = _mix64(key ^ np.uint64(_h64(seed, "fleet", table)))
    return _uuid_text(hi, key)  # key < 2^62: the variant bits take nothing of it


def _templates(spec: FleetSpec) -> list[dict[str, pl.DataFrame]]:
    model = spec.embedding_model if spec.recalls else None  # vectors as record_turn writes them (dev.live)
    out = [generate(SeedSpec(tenants=1, scopes_per_tenant=0, nodes_per_scope=spec.nodes,
                             seed=spec.seed * 1000 + k, now=spec.now, embedding_model=model)) for k in range(spec.templates)]
    return [_with_recalls(spec, k, frames) for k, frames in enumerate(out)] if spec.recalls else out


def _targets(spec: FleetSpec, k: int, nodes: pl.DataFrame, edges: pl.DataFrame) -> np.ndarray:
    """Row indexes of the template's query targets, each drawn weak (phase 3 prunes it) with
    probability 1/8, old (phase 9 decays it) 3/8, else any ordinary semantic node; distinct, never
    protected or META (a kind with no node left: any of the others)."""
    now = spec.now
    degree = (pl.concat([edges.select(pl.col("source_id").alias("id")), edges.select(pl.col("target_id").alias("id"))])
              .group_by("id").agg(pl.len().alias("_deg")))
    info = nodes.select("id", "layer", "label", "importance", "updated_at").join(degree, on="id", how="left",
                                                                                 maintain_order="left")
    ordinary = ((pl.col("layer") == "semantic")
                & ~pl.any_horizontal([pl.col("label").str.starts_with(p) for p in _PROTECTED]))
    weak = ordinary & (pl.col("importance") < 4.0) & (pl.col("updated_at") < now - timedelta(days=8)) \
        & (pl.col("_deg").fill_null(0) <= 1)
    old = ordinary & ~weak & (pl.col("updated_at") < now - timedelta(days=31)) & (pl.col("importance") < 8.0)
    pools = info.select(weak.alias("weak"), old.alias("old"), (ordinary & ~weak & ~old).alias("plain"))
    pools = {name: np.flatnonzero(pools.get_column(name).to_numpy()) for name in pools.columns}
    rng = _rng(spec.seed, "fleet-recalls", k)
    taken: list[int] = []
    for kind in rng.choice(("weak", "old", "plain"), size=spec.recall_queries, p=(0.125, 0.375, 0.5)):
        free = np.setdiff1d(pools[kind], taken)
        if not len(free):
            free = np.setdiff1d(np.concatenate(list(pools.values())), taken)
        if not len(free):
            break
        taken.append(int(rng.choice(free)))
    return np.array(taken, dtype=np.int64)


def _with_recalls(spec: FleetSpec, k: int, frames: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Template ``k`` (its vectors the embedder's, :mod:`deep_sleep.dev.live`) with the recall events
    of its queries (module docstring): one row per hit, with ``_qi`` (the query's index) and ``_fb``
    (the explicit label the hit gets when its (scope, query) has feedback) for :func:`_feedback`."""
    nodes = frames["memory_nodes"]
    model = embedder(spec.embedding_model)
    emb = nodes.select("id", "embedding")
    vec = emb.get_column("embedding").to_numpy().reshape(nodes.height, EMBEDDING_DIM)
    targets = _targets(spec, k, nodes, frames["memory_edges"])
    words = nodes.get_column("label").gather(targets).str.split(" ").list.slice(1, 2).list.join(" ")
    wanted = (pl.DataFrame({"query": ("what about " + words).to_list(), "target": nodes.get_column("id").gather(targets)})
              .unique("query", keep="first", maintain_order=True).with_row_index("_qi"))
    rng = _rng(spec.seed, "fleet-recall-times", k)
    asked = wanted.with_columns(pl.Series("created_at", [spec.now - timedelta(microseconds=int(u)) for u in
                                                         rng.integers(_HOUR, 20 * _HOUR, wanted.height)],
                                          dtype=pl.Datetime("us", "UTC")))
    path, tenant = nodes.get_column("scope_path")[0], nodes.get_column("tenant_id")[0]
    probe = asked.select(pl.lit(path).alias("scope_path"), "query", pl.col("target").alias("node_id"),
                         pl.lit(1.0).alias("label"), pl.lit("explicit").alias("label_source"), "created_at")
    tables = {n: conform(n, f.drop("tenant_id", strict=False)) for n, f in frames.items() if n != "recall_events"}
    tables["memory_nodes"] = conform("memory_nodes", nodes.drop("tenant_id", "embedding", "embedding_model"))
    tables["recall_events"] = conform("recall_events", probe)
    hits = ranked_hits(Snapshot(path, spec.now, None, tables), GateConfig(k=RECALL_K, max_queries=len(targets)),
                       emb, now=spec.now, with_scores=True, embedder=model)
    hits = hits.join(asked, on="query").sort("_qi", "rank")
    # similarity as cosine (the live recall's 1 − distance), 0 for a node reached by spreading only
    qvec = model.embed(hits.get_column("query").to_list())
    row = dict(zip(nodes.get_column("id").to_list(), range(nodes.height)))
    hit_rows = np.array([row[n] for n in hits.get_column("node_id").to_list()], dtype=np.int64)
    sim = np.clip(np.einsum("ij,ij->i", qvec, vec[hit_rows]).astype(np.float64), 0.0, 1.0).round(4)
    found = hits.group_by("_qi").agg((pl.col("node_id") == pl.col("target")).any().alias("_found"))
    hits = hits.join(found, on="_qi", maintain_order="left")
    used = pl.when(pl.col("_found")).then(pl.col("node_id") == pl.col("target")).otherwise(pl.col("rank") == 1)
    m = hits.height
    recalls = pl.DataFrame([
        pl.Series("id", [None] * m, dtype=pl.String),  # replaced per copy
        pl.Series("scope_path", [path] * m), pl.Series("tenant_id", [tenant] * m),
        hits.get_column("query"), hits.get_column("node_id"), pl.Series("similarity", sim),
        pl.Series("features", np.round(rng.random((m, 12)), 4)).cast(pl.List(pl.Float64)),
        hits.get_column("score").round(6),
        pl.Series("label", [None] * m, dtype=pl.Float64), pl.Series("label_source", [None] * m, dtype=pl.String),
        pl.Series("trained_at", [None] * m, dtype=pl.Datetime("us", "UTC")),
        hits.get_column("created_at"), pl.Series("version", [1] * m, dtype=pl.Int64),
        hits.get_column("_qi").cast(pl.Int64), hits.select(used.cast(pl.Float64).alias("_fb")).to_series(),
    ])
    return {**frames, "memory_nodes": nodes, "recall_events": recalls}


def _feedback(spec: FleetSpec, recalls: pl.DataFrame, owner: np.ndarray) -> pl.DataFrame:
    """Explicit labels on the hits of the (scope, query) pairs that have feedback: of each scope's
    queries, the ``max(1, round(feedback_share × queries))`` of the smallest splitmix64 draws of
    (seed, scope, query) (none at share 0); the helper columns dropped."""
    qi = recalls.get_column("_qi").to_numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        draw = _mix64((owner.astype(np.uint64) << np.uint64(16) | qi) ^ np.uint64(_h64(spec.seed, "fleet-feedback")))
    pairs = pl.DataFrame({"o": owner, "q": qi, "d": draw >> np.uint64(11)})
    queries = pairs.unique(["o", "q"]).with_columns(
        pl.col("d").rank("ordinal").over("o").alias("r"), pl.len().over("o").alias("n"))
    wanted = 0 if spec.feedback_share == 0 else pl.max_horizontal(
        (pl.col("n") * spec.feedback_share).round(0).cast(pl.Int64), pl.lit(1))
    chosen = queries.filter(pl.col("r") <= wanted).select("o", "q", pl.lit(True).alias("g"))
    give = pairs.join(chosen, on=["o", "q"], how="left", maintain_order="left").get_column("g").fill_null(False).to_numpy()
    label = pl.when(pl.Series(give)).then(pl.col("_fb")).otherwise(None)
    return recalls.with_columns(label.alias("label"),
                                pl.when(pl.Series(give)).then(pl.lit("explicit")).otherwise(None).alias("label_source"),
                                ).drop("_qi", "_fb")


def _replicate(spec: FleetSpec, table: str, templates: list[dict[str, pl.DataFrame]],
               scopes: np.ndarray, paths: pl.Series, tenants: pl.Series) -> pl.DataFrame:
    """``table``'s rows for the given scope indexes: each a copy of its template's rows."""
    parts = []
    for k, frames in enumerate(templates):
        mine = scopes[scopes % spec.templates == k]
        t = frames[table]
        if not len(mine) or not t.height:
            continue
        node_index = dict(zip(frames["memory_nodes"]["id"].to_list(), range(frames["memory_nodes"].height)))
        rows = np.tile(np.arange(t.height, dtype=np.int64), len(mine))
        owner = np.repeat(mine, t.height)
        copy = t.gather(rows)
        cols = [paths.gather(owner).alias("scope_path"), tenants.gather(owner).alias("tenant_id"),
                pl.Series("_owner", owner)]
        if "id" in t.columns and TABLES[table][0].kind == "uuid":
            cols.append(_uuids(spec.seed, table, owner, rows).alias("id"))
        for ref in _NODE_REFS.get(table, ()):
            local = np.array([node_index.get(v, -1) for v in t[ref].to_list()], dtype=np.int64)[rows]
            ids = _uuids(spec.seed, "memory_nodes", owner, np.where(local < 0, (1 << 23) + rows, local))
            cols.append(pl.when(pl.Series(local >= 0)).then(ids).otherwise(None).alias(ref)
                        if (local < 0).any() else ids.alias(ref))
        parts.append(copy.with_columns(cols))
    if not parts:
        return templates[0][table].clear().drop("_qi", "_fb", strict=False)
    # in scope order (zero-padded paths: index order is path order), each scope's rows as its template's
    out = pl.concat(parts, how="vertical").sort("_owner", maintain_order=True)
    if "_qi" in out.columns:
        out = _feedback(spec, out, out.get_column("_owner").to_numpy())
    return out.drop("_owner")


def generate_fleet(spec: FleetSpec, scopes: range | None = None,
                   tables: tuple[str, ...] | None = None) -> dict[str, pl.DataFrame]:
    """The rows of ``tables`` (default: all) for ``scopes`` (default: the whole fleet), as
    :func:`deep_sleep.dev.seed.load` takes them; a pure function of its arguments."""
    chosen = np.arange(spec.scopes, dtype=np.int64) if scopes is None else np.asarray(scopes, dtype=np.int64)
    paths, tenants = _scope_columns(spec.scopes)
    templates = _templates(spec)
    return {table: _replicate(spec, table, templates, chosen, paths, tenants) for table in (tables or TABLES)}


def iter_fleet(spec: FleetSpec, scopes_per_chunk: int = 10_000) -> Iterator[dict[str, pl.DataFrame]]:
    """The fleet in chunks of scopes (bounded memory)."""
    paths, tenants = _scope_columns(spec.scopes)
    templates = _templates(spec)
    for start in range(0, spec.scopes, scopes_per_chunk):
        chosen = np.arange(start, min(spec.scopes, start + scopes_per_chunk), dtype=np.int64)
        yield {table: _replicate(spec, table, templates, chosen, paths, tenants) for table in TABLES}


SEED_CHUNK_SCOPES = 10_000  # scopes generated and loaded at a time by seed_fleet (~1.5M edges: ~1 GB of frames)


def seed_fleet(store, spec: FleetSpec, progress=None, scopes_per_chunk: int = SEED_CHUNK_SCOPES) -> dict[str, int]:
    """Generate the fleet and load it into ``store`` in one transaction, ``scopes_per_chunk`` scopes
    at a time (:func:`iter_fleet`): memory is bounded by a chunk, whatever the fleet's size.  Large
    tables are loaded without their indexes, rebuilt once after the last chunk
    (:class:`deep_sleep.dev.load.BulkLoad`).  Rows per table.  ``progress`` (optional) is called
    with one line per chunk, one for the index rebuild, and one per table at the end."""
    from deep_sleep.dev.load import BulkLoad

    if scopes_per_chunk < 1:
        raise SeedError(f"seed_fleet: scopes_per_chunk must be >= 1, got {scopes_per_chunk}")
    say = progress or (lambda line: None)
    t0 = time.perf_counter()
    chunks = -(-spec.scopes // scopes_per_chunk)
    with store.transaction() as cur:
        bulk = BulkLoad(cur)
        frames_of = iter_fleet(spec, scopes_per_chunk)  # the templates built once
        for k in range(chunks):
            t1 = time.perf_counter()
            frames = next(frames_of)
            t2 = time.perf_counter()
            rows = 0
            for table, frame in frames.items():
                rows += bulk.add(table, frame, expected_rows=frame.height * chunks)
            del frames
            first, last = k * scopes_per_chunk, min(spec.scopes, (k + 1) * scopes_per_chunk) - 1
            line = (f"chunk {k + 1}/{chunks} (scopes {first:,}–{last:,}): {rows:,} rows, generated {t2 - t1:.1f}s, "
                    f"loaded {time.perf_counter() - t2:.1f}s")
            log.info("fleet %s", line)
            say(line)
        t3 = time.perf_counter()
        counts = bulk.finish()
        say(f"indexes rebuilt in {time.perf_counter() - t3:.1f}s")
    for table, n in counts.items():
        say(f"{table}: {n:,} rows")
    log.info("fleet of %d scopes seeded in %.1fs", spec.scopes, time.perf_counter() - t0)
    return counts


# -- a day of live turns over the whole fleet (the benchmark's second night) -----------------------
#: The statements of :func:`live_day`, in order.  ``%(start)s``: the day's start (the first night's
#: ``as_of``); ``%(turns)s``: turns per scope; ``%(day)s``: a day number (ids and labels of
#: different days differ).  Turn ``t`` of a scope happens at ``start + t · 24 h / (turns + 1)``.
_DAY_SQL = (
    # the scopes (every scope of the store with nodes, if none are named), and their tenants
    ("CREATE TEMP TABLE _day_scopes ON COMMIT DROP AS SELECT scope_path, min(tenant_id) AS tenant_id"
     " FROM memory_nodes WHERE scope_path IS NOT NULL AND (%(scopes)s::text[] IS NULL OR scope_path = ANY(%(scopes)s::text[]))"
     " GROUP BY scope_path"),
    ("CREATE TEMP TABLE _day_turns ON COMMIT DROP AS SELECT s.scope_path, s.tenant_id, t.turn,"
     " %(start)s::timestamptz + make_interval(secs => t.turn * 86400.0 / (%(turns)s + 1)) AS at,"
     " md5(s.scope_path || '/day' || %(day)s || '/turn/' || t.turn) AS key"
     " FROM _day_scopes s CROSS JOIN generate_series(1, %(turns)s) AS t(turn)"),
    # the semantic nodes a scope's turns revisit: 2 per turn, in an order fixed by (id, day); never
    # a protected node (SOUL:, AGENT_IDENTITY:, META:), which the online path does not write either
    ("CREATE TEMP TABLE _day_picks ON COMMIT DROP AS SELECT scope_path, id, k FROM ("
     " SELECT scope_path, id, row_number() OVER (PARTITION BY scope_path ORDER BY md5(id::text || %(day)s)) AS k"
     " FROM memory_nodes JOIN _day_scopes USING (scope_path) WHERE layer = 'semantic' AND label NOT LIKE 'SOUL:%%'"
     " AND label NOT LIKE 'AGENT_IDENTITY:%%' AND label NOT LIKE 'META:%%') AS ranked WHERE k <= 2 * %(turns)s"),
    # every turn learns a new fact (a new node) and revisits a known one (an update: version + 1)
    ("INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, access_count,"
     " created_at, updated_at) SELECT key::uuid, scope_path, tenant_id, 'semantic',"
     " 'day ' || %(day)s || ' fact ' || turn, jsonb_build_object('text', 'learned in turn ' || turn), 5.0, 1, at, at"
     " FROM _day_turns"),
    ("UPDATE memory_nodes AS n SET access_count = n.access_count + 1, updated_at = t.at,"
     " properties = n.properties || jsonb_build_object('last_turn', t.turn)"
     " FROM _day_turns t JOIN _day_picks p ON p.scope_path = t.scope_path AND p.k = t.turn"
     " WHERE n.id = p.id"),
    # the first turn leaves a scratch note in working memory that expires two hours later
    ("INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, access_count,"
     " created_at, updated_at) SELECT md5(key || '/working')::uuid, scope_path, tenant_id, 'working',"
     " 'scratch of day ' || %(day)s, jsonb_build_object('ttl_hours', 2), 5.0, 1, at, at FROM _day_turns WHERE turn = 1"),
    # each turn's summary event (as record_turn writes it), two sessions a day
    ("INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, metadata, created_at)"
     " SELECT md5(key || '/event')::uuid, scope_path, tenant_id, 'day' || %(day)s || '-s' || ((turn - 1) * 2 / %(turns)s),"
     " 'turn ' || turn || ': 2 nodes written, 1 read', jsonb_build_object('kind', 'turn_summary', 'turn', turn), at"
     " FROM _day_turns"),
    # the access log: the two nodes each turn wrote, and one more it read
    ("INSERT INTO memory_access_log (scope_path, tenant_id, node_id, accessed_at, kind)"
     " SELECT scope_path, tenant_id, key::uuid, at, 'write' FROM _day_turns"
     " UNION ALL SELECT t.scope_path, t.tenant_id, w.id, t.at, 'write'"
     " FROM _day_turns t JOIN _day_picks w ON w.scope_path = t.scope_path AND w.k = t.turn"
     " UNION ALL SELECT t.scope_path, t.tenant_id, r.id, t.at, 'read'"
     " FROM _day_turns t JOIN _day_picks r ON r.scope_path = t.scope_path AND r.k = %(turns)s + t.turn"),
)


def live_day(store, start: datetime, turns: int = 10, day: int = 1, scopes: list[str] | None = None) -> dict[str, int]:
    """Write one day of live turns into each of ``scopes`` (None: every scope of ``store``) in one
    transaction, set-based (the online path, one turn at a time, would take ~10 ms a turn: 3 hours
    for 100k scopes × 10 turns).

    Per scope, ``turns`` turns spread over the 24 hours after ``start``, as :func:`record_turn
    <deep_sleep.online.turn.record_turn>` would file them: each turn inserts a new semantic node and
    updates a known one (so its ``version`` moves on), the first one also a working-memory note with
    ``ttl_hours`` 2; every turn writes its summary event (two sessions a day) and three access-log
    rows (the two nodes it wrote and one it read).  A turn's two nodes share its instant, so they
    co-occur (phase 1.5).  Every row stays in its scope: ids derive from (scope, ``day``, turn), and
    the nodes a turn revisits are its own scope's.  A dev tool for the fleet benchmark's next-day
    night (a steady-state night after a first one).  Rows written per table."""
    if turns < 1 or day < 1:
        raise SeedError(f"live_day: turns and day must be >= 1, got turns={turns}, day={day}")
    params = {"start": start, "turns": turns, "day": day, "scopes": None if scopes is None else list(scopes)}
    counts: dict[str, int] = {}
    tables_of = ("memory_nodes", "memory_nodes", "memory_nodes", "episodic_events", "memory_access_log")
    with store.pg() as con:
        cur = con.cursor()
        for sql in _DAY_SQL[:3]:
            cur.execute(sql, params)
        for table, sql in zip(tables_of, _DAY_SQL[3:], strict=True):
            cur.execute(sql, params)
            counts[table] = counts.get(table, 0) + cur.rowcount
        con.commit()
    log.info("live day %d: %s", day, counts)
    return counts


__all__ = ["FleetSpec", "fleet_scope", "fleet_scopes", "generate_fleet", "iter_fleet", "live_day", "seed_fleet",
           "SEED_CHUNK_SCOPES"]
