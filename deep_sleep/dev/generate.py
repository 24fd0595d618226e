"""The synthetic store's frames: :func:`generate`, a pure function of a :class:`SeedSpec`.

Same spec, same frames, byte for byte; vectorized with numpy/polars: the only Python loops run
per scope or over a handful of special rows.  One module per table family builds a scope's rows
(:mod:`~deep_sleep.dev.nodes`, :mod:`~deep_sleep.dev.edges`, :mod:`~deep_sleep.dev.events`,
:mod:`~deep_sleep.dev.small_tables`); this one walks the scopes and shapes the frames.

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

from datetime import timedelta

import polars as pl

from deep_sleep.core.embedding import embedder
from deep_sleep.core.scope import SEP
from deep_sleep.core.tables import EMBEDDING_DIM, TABLES
from deep_sleep.dev.arrays import _EPOCH, ScopeCtx
from deep_sleep.dev.edges import gen_edges
from deep_sleep.dev.events import gen_access, gen_episodic
from deep_sleep.dev.live import recall_log, with_vectors
from deep_sleep.dev.nodes import gen_nodes
from deep_sleep.dev.small_tables import gen_small
from deep_sleep.dev.spec import SeedSpec, nodes_in, scopes_of, tenant_name

__all__ = ["generate"]


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
    episodic_events also carry ``embedding`` (fixed-size float32 unit vectors); with
    ``spec.embedding_model``, memory_nodes, episodic_events and procedural_skills carry that
    embedder's ``embedding`` and ``embedding_model``, and recall_events is the live recall's log
    (:mod:`deep_sleep.dev.live`).
    """
    now = (spec.now - _EPOCH) // timedelta(microseconds=1)
    parts: dict[str, list[pl.DataFrame]] = {t: [] for t in TABLES}
    for index, scope in enumerate(scopes_of(spec)):
        c = ScopeCtx(spec, scope.path, scope.tenant_id, scope.path, nodes_in(spec, scope), now, legacy=False)
        nodes, info = gen_nodes(c)
        parts["memory_nodes"].append(nodes)
        parts["memory_edges"].append(gen_edges(c, nodes, info))
        parts["episodic_events"].append(gen_episodic(c, nodes, info))
        parts["memory_access_log"].append(gen_access(c, nodes, info))
        for table, df in gen_small(c, nodes, info, index).items():
            parts[table].append(df)
    if spec.legacy_rows:
        for t in range(spec.tenants):
            n = spec.legacy_rows // spec.tenants + (1 if t < spec.legacy_rows % spec.tenants else 0)
            if not n:
                continue
            tid = tenant_name(t)
            c = ScopeCtx(spec, None, tid, f"legacy{SEP}{tid}", n, now, legacy=True)
            nodes, info = gen_nodes(c)
            parts["memory_nodes"].append(nodes)
            edges = gen_edges(c, nodes, info)
            if edges.height:
                parts["memory_edges"].append(edges.head(n))
            parts["episodic_events"].append(gen_episodic(c, nodes, info).head(max(1, n // 2)))
    frames = {t: _shape(t, parts[t], spec.embeddings) for t in TABLES}
    if spec.embedding_model is not None:  # as the live path writes it (deep_sleep.dev.live)
        model = embedder(spec.embedding_model)
        frames = with_vectors(frames, model)
        frames["recall_events"] = recall_log(frames["memory_nodes"], model, seed=spec.seed, now_us=now)
    return frames
