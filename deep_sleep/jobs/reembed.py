"""``deep-sleep reembed``: give every stored vector the configured model's (SPEC §5 as amended).

The store records which model made each vector (``embedding_model`` on nodes, events and skills);
recall, the nightly and the gate refuse to compare vectors of two models.  Changing
``embedding.model`` on a store that holds vectors is therefore this job: it walks ``memory_nodes``,
``episodic_events``, ``episodic_folded`` (the turns a summary carries) and ``procedural_skills`` (all
scopes, or the ones named) in id order, in batches,
and rewrites each row whose ``embedding_model`` is not the configured model's ``name`` — a vector of
another model, or none at all (a node an older night wrote without one) — from the row's text:

- a node: :func:`deep_sleep.core.embedding.node_text` (its label and property values; a ``META:``
  node's label and text), the rule the live path and the night use;
- an event (hot or folded): its content; a skill: ``"<name> <description>"``, as ``record_turn`` embeds them.

Each batch is one short transaction.  A row is rewritten only at the version it was read
(``version`` guard): a row a live turn changed meanwhile keeps the vector that turn wrote and is
counted as skipped; run the job again to pick up what was skipped.  The version trigger bumps every
rewritten row, so a night in flight that read it before conflicts on it (and retries it the next
night) rather than overwrite it.  Before any vector, the job records the new model for the tenants
of the scopes it rewrites (for every tenant, without scopes: ``embedding_models``), so from then on
their turns and recalls must use it and a writer of the old model is refused; re-embed every scope
of a tenant (its root scope's subtree) for its recalls to find only the new model's vectors.
A text with nothing to embed gets no vector, its ``embedding_model``
saying which model found nothing, and is counted as ``empty``.  Idempotent: a second run finds
nothing to do.

    >>> report = reembed(store, load_config({"embedding": {"model": "wordllama"}}))   # doctest: +SKIP
    >>> report.rewritten                                                              # doctest: +SKIP
    {'memory_nodes': 1210, 'episodic_events': 360, 'episodic_folded': 5160, 'procedural_skills': 0}
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from deep_sleep.core.embedding import EmbeddingProvider, embedder_for, node_text
from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.store.db import Store
from deep_sleep.store.vectors import SET_MODEL_SQL

__all__ = ["ReembedReport", "TABLES", "reembed"]

#: Table → (the columns its text is made of, how).
TABLES: dict[str, tuple[str, Callable[[tuple], str]]] = {
    "memory_nodes": ("label, properties", lambda r: node_text(r[0] or "", r[1] if isinstance(r[1], dict) else
                                                              json.loads(r[1]) if r[1] else {})),
    "episodic_events": ("content", lambda r: r[0] or ""),
    "episodic_folded": ("content", lambda r: r[0] or ""),  # turns a summary carries (phase 10)
    "procedural_skills": ("name, description", lambda r: f"{r[0] or ''} {r[1] or ''}"),
}
DEFAULT_BATCH = 1000
MAX_BATCH = 1_000_000  # rows per transaction at most (a bigger batch is one long transaction that holds its row locks)


@dataclass
class ReembedReport:
    """What a run did, per table: rows rewritten with the model's vector, rows left as they were
    because a live write changed them meanwhile (run again), rows whose text has nothing to embed."""

    model: str
    rewritten: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    empty: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "rewritten": self.rewritten, "skipped": self.skipped, "empty": self.empty,
                "seconds": round(self.seconds, 3)}


def _select_sql(table: str, scoped: bool) -> str:
    cols, _ = TABLES[table]
    where = " AND scope_path = ANY(%(paths)s)" if scoped else ""
    return (f"SELECT id, version, {cols} FROM {table} WHERE id > %(after)s AND embedding_model IS DISTINCT FROM %(model)s"
            f"{where} ORDER BY id LIMIT %(batch)s")


def _update_sql(table: str, n: int) -> str:
    values = ", ".join(["(%s::uuid, %s::bigint, %s::vector, %s)"] * n)
    return (f"UPDATE {table} t SET embedding = v.embedding, embedding_model = v.model FROM (VALUES {values})"
            f" AS v(id, version, embedding, model) WHERE t.id = v.id AND t.version = v.version RETURNING v.embedding IS NULL")


def reembed(store: Store, config=None, scopes: Iterable[Scope | str] | None = None, *, batch_size: int = DEFAULT_BATCH,
            embedder: EmbeddingProvider | None = None, progress: Callable[[str], None] | None = None) -> ReembedReport:
    """Rewrite every vector of ``scopes`` (default: the whole store) that the configured model
    (``config.embedding.model``, or ``embedder``) did not make; see the module docstring."""
    from deep_sleep.online.pg import vector_text
    from deep_sleep.transforms.config import load_config

    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or not 1 <= batch_size <= MAX_BATCH:
        raise InputError(f"reembed: batch_size must be an integer from 1 to {MAX_BATCH:,} (rows per transaction), "
                         f"got {batch_size!r}")
    embedder = embedder or embedder_for(config or load_config())
    paths = None if scopes is None else sorted({Scope.coerce(s).path for s in scopes})
    say = progress or (lambda msg: print(msg, file=sys.stderr))
    report = ReembedReport(embedder.name)
    started = time.perf_counter()
    with store.pg() as con:
        # first the tenants' model (embedding_models): from here on their writers and readers use the new one
        if paths is None:
            con.execute("UPDATE embedding_models SET model = %s, updated_at = now() WHERE model <> %s",
                        (embedder.name, embedder.name))
        for tenant in sorted({Scope.parse(p).tenant_id for p in paths or ()}):
            con.execute(SET_MODEL_SQL, (tenant, embedder.name))
        con.commit()
        for table, (_, text_of) in TABLES.items():
            done = skipped = empty = 0
            after = "00000000-0000-0000-0000-000000000000"
            while True:
                rows = con.execute(_select_sql(table, paths is not None),
                                   {"after": after, "model": embedder.name, "paths": paths, "batch": batch_size}).fetchall()
                if not rows:
                    con.commit()
                    break
                after = str(rows[-1][0])
                vectors = embedder.embed([text_of(r[2:]) for r in rows])
                params: list[Any] = []
                for r, v in zip(rows, vectors, strict=True):
                    params += [str(r[0]), r[1], vector_text(v), embedder.name]
                landed = con.execute(_update_sql(table, len(rows)), params).fetchall()
                con.commit()  # one short transaction per batch
                done += len(landed)
                empty += sum(1 for (no_vector,) in landed if no_vector)
                skipped += len(rows) - len(landed)
                say(f"reembed {table}: {done:,} rewritten, {skipped:,} skipped")
            report.rewritten[table], report.skipped[table], report.empty[table] = done - empty, skipped, empty
    report.seconds = time.perf_counter() - started
    return report
