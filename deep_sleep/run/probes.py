"""The gate's own probes (SPEC §9 as amended 2026-12-06, issue 36 item 3): most agents give no
feedback, so before apply the gate also asks each scope, by itself, whether what tonight removes,
folds or demotes can still be found.

    >>> results = probe_gate(shard, diff, config)[scope_path]          # doctest: +SKIP
    >>> results.probes, results.found_before, results.found_after       # doctest: +SKIP
    (8, 8, 7)

**Probes.**  A probe is a row the night removes, folds or demotes, and a query made from its own text:

- a *folded* turn — an episodic event phase 10 deletes into a ``META:episodic_summary`` node (its
  reason names the node): its content; found after the night when its summary node is;
- a *pruned* fact — a semantic node (not a ``META:`` node) the night deletes (phases 3 and the
  rest; working memory's TTL expiry is by design and not probed): its label; nothing carries it after;
- a *demoted* fact — a semantic node whose importance the night lowers (phase 9): its label; found
  after when the node is.

Per scope at most ``gate.probes`` of them (0 switches the probes off), chosen by a seeded hash of the
row's scope and id (``gate.probe_seed``): the same night, the same sample.  Dropped edges are not
probed (the ranker below does not spread along edges).

**Findable.**  Each probe's query is its text's first :data:`MAX_WORDS` distinct words of three or
more letters that are not stop words (as recall takes a query's words).  The scope's rows are ranked
for it as recall ranks word matches — the sum over the query words a row holds of ``ln(1 + (N − df +
½) / (df + ½))``, ``N`` the scope's rows, ``df`` those holding the word; ties by id — before the diff
(the snapshot) and after it (the snapshot with the diff folded in: the new summary nodes with their
word key, ``properties.keywords``, the folded events gone).  A row's text: a node's label (a ``META:``
node's label, summary and keywords), an event's content.  Each hit hands the reader its passage, at
most ``recall.max_passage_chars`` characters (a summary's counts as a whole passage).  The probe is
*found* when its row — or, after, the row that now carries it — is among the ``gate.k`` best and
ends within ``recall.budget_chars`` characters of the ranked hits.  Vectors are not used (a night
writes its nodes' vectors only at apply time), nor the reranker's small adjustment: the same ranker
before and after, so the comparison is fair, and it costs no database read.

**Verdict.**  The share of the probes found, before and after, estimates how many of the ``candidates``
(every row the night removes, folds or demotes, of which the probes are a sample) it makes
unfindable: ``lost = candidates × (found before − found after) / probes``; measured against what the
scope holds for recall to search (its nodes and events before the night, ``memory``), ``drop_pp = 100
× lost / memory`` is the share of the scope's memory the night loses, in percentage points.  The
probes fail when ``drop_pp > gate.probe_max_drop_pp`` (10) and ``lost ≥ gate.probe_min_lost`` (3): pruning
a weak fact or two of a hundred passes, and so does a tiny scope's one weak fact; pruning most of a
scope does not; a fold that keeps every turn findable loses nothing.  No
probe (the night removes, folds or demotes nothing findable): ``nothing_removed``; none found before:
``zero_before`` — neither is a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import polars as pl
from deep_sleep.transforms.episodic_summary import FOLD_REASON
from deep_sleep.transforms.label_recalls import STOP_WORDS, WORD

from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard

__all__ = ["MAX_WORDS", "ProbeResult", "probe_gate"]

#: A probe's query: the first this many distinct words of its row's text (recall's ``MAX_WORDS``).
MAX_WORDS = 24
_TEXT = {"id": pl.String, "scope_path": pl.String, "text": pl.String, "meta": pl.Boolean}


@dataclass(frozen=True)
class ProbeResult:
    """One scope's probes: how many, how many were found before and after the diff, and the verdict.

    status: ``measured``, ``nothing_removed`` (no probe) or ``zero_before`` (none found before).
    kinds: probes by kind (``folded``, ``pruned``, ``demoted``).
    candidates: the rows the night removes, folds or demotes (the probes are a sample of them).
    memory: the scope's nodes and events before the night.
    """

    probes: int
    found_before: int
    found_after: int
    failed: bool
    status: str
    kinds: dict[str, int]
    candidates: int = 0
    memory: int = 0

    @property
    def lost(self) -> float:
        """The candidates estimated to become unfindable (module docstring)."""
        return self.candidates * (self.found_before - self.found_after) / self.probes if self.probes else 0.0

    @property
    def drop_pp(self) -> float | None:
        if not self.probes:
            return None
        return 100.0 * self.lost / max(self.memory, 1)

    def to_report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "probes": self.probes}
        if self.probes:
            out.update(found_before=self.found_before, found_after=self.found_after, candidates=self.candidates,
                       memory=self.memory, drop_pp=round(self.drop_pp, 3), failed=self.failed, kinds=self.kinds)
        return out


def _words(text: pl.Expr) -> pl.Expr:
    """The distinct words of ``text`` (3+ letters, lower case), in order."""
    return text.str.to_lowercase().str.extract_all(WORD).list.unique(maintain_order=True)


def _candidates(shard: Shard, diff: Diff) -> pl.DataFrame:
    """(scope_path, id, kind, carrier, text) of every row the diff removes, folds or demotes."""
    nodes = shard.table("memory_nodes")
    events = shard.table("episodic_events")
    nd, ed = diff.table("memory_nodes").frames(), diff.table("episodic_events").frames()
    facts = nodes.filter((pl.col("layer") == "semantic") & ~pl.col("label").str.starts_with("META:")).select(
        "scope_path", "id", pl.col("label").alias("text"), pl.col("importance").alias("_was"))
    parts = []
    if nd["deletes"].height:
        parts.append(facts.join(nd["deletes"].select("scope_path", "id"), on=["scope_path", "id"], how="semi")
                     .select("scope_path", "id", pl.lit("pruned").alias("kind"), pl.lit(None, pl.String).alias("carrier"),
                             "text"))
    ups = nd["updates"]
    if ups.height and "importance" in ups.columns:
        lowered = (facts.join(ups.select("scope_path", "id", pl.col("importance").alias("_now")), on=["scope_path", "id"])
                   .filter(pl.col("_now").is_not_null() & (pl.col("_now") < pl.col("_was"))))
        parts.append(lowered.select("scope_path", "id", pl.lit("demoted").alias("kind"), pl.col("id").alias("carrier"), "text"))
    if ed["deletes"].height:
        gone = ed["deletes"].select(
            "scope_path", "id",
            pl.when(pl.col("reason").str.starts_with(FOLD_REASON)).then(pl.lit("folded")).otherwise(pl.lit("removed")).alias("kind"),
            pl.when(pl.col("reason").str.starts_with(FOLD_REASON)).then(pl.col("reason").str.slice(len(FOLD_REASON)))
            .otherwise(pl.lit(None, pl.String)).alias("carrier"))
        parts.append(gone.join(events.select("scope_path", "id", pl.col("content").alias("text")), on=["scope_path", "id"]))
    if not parts:
        return pl.DataFrame(schema={"scope_path": pl.String, "id": pl.String, "kind": pl.String, "carrier": pl.String,
                                    "text": pl.String})
    return pl.concat(parts, how="vertical_relaxed").filter(pl.col("text").is_not_null())


def _documents(state: Shard, scopes: pl.Series) -> pl.DataFrame:
    """(scope_path, id, text, meta) of every row recall searches in the scopes: nodes and events."""
    nodes = state.table("memory_nodes").filter(pl.col("scope_path").is_in(scopes.implode()))
    props = pl.col("properties") if "properties" in nodes.columns else pl.lit(None, pl.String)
    meta = pl.col("label").str.starts_with("META:")
    node_text = pl.when(meta).then(pl.concat_str([pl.col("label"), props.str.json_path_match("$.summary").fill_null(""),
                                                   props.str.json_path_match("$.keywords").fill_null("")], separator=" "))
    docs = [nodes.select("id", "scope_path", node_text.otherwise(pl.col("label")).alias("text"), meta.alias("meta"))]
    events = state.table("episodic_events")
    if events.height:
        docs.append(events.filter(pl.col("scope_path").is_in(scopes.implode()))
                    .select("id", "scope_path", pl.col("content").alias("text"), pl.lit(False).alias("meta")))
    return pl.concat([d.cast(_TEXT) for d in docs]).filter(pl.col("text").is_not_null())


def _found(state: Shard, probes: pl.DataFrame, k: int, budget: int, max_passage: int, after: bool) -> pl.DataFrame:
    """(p): the probes found in ``state`` (module docstring)."""
    docs = _documents(state, probes.get_column("scope_path").unique())
    stop = list(STOP_WORDS)
    dwords = (docs.select("scope_path", "id", _words(pl.col("text")).alias("word")).explode("word")
              .drop_nulls("word").filter(~pl.col("word").is_in(stop)))
    n = docs.group_by("scope_path").agg(pl.len().alias("n"))
    idf = (dwords.group_by("scope_path", "word").agg(pl.len().alias("df")).join(n, on="scope_path")
           .select("scope_path", "word",
                   (1 + (pl.col("n") - pl.col("df") + 0.5) / (pl.col("df") + 0.5)).log().alias("idf")))
    qwords = probes.select("p", "scope_path", "qwords").explode("qwords").rename({"qwords": "word"}).drop_nulls("word")
    chars = docs.select("scope_path", "id", pl.when(pl.col("meta")).then(pl.lit(max_passage))
                        .otherwise(pl.min_horizontal(pl.col("text").str.len_chars(), pl.lit(max_passage))).alias("chars"))
    ranked = (
        qwords.join(idf, on=["scope_path", "word"]).join(dwords, on=["scope_path", "word"])
        .group_by("p", "scope_path", "id").agg(pl.col("idf").sum().alias("score"))
        .sort(["p", "score", "id"], descending=[False, True, False])
        .with_columns(pl.int_range(pl.len()).over("p").alias("rank"))
        .filter(pl.col("rank") < k)
        .join(chars, on=["scope_path", "id"])
        .sort(["p", "rank"])
        .with_columns(pl.col("chars").cum_sum().over("p").alias("ends_at"))
        .filter(pl.col("ends_at") <= budget)
    )
    target = pl.col("id") == pl.col("target")
    if after:
        target = target | (pl.col("id") == pl.col("carrier"))
    return (ranked.join(probes.select("p", "target", "carrier"), on="p").filter(target).select("p").unique())


def probe_gate(shard: Shard, diff: Diff, config: Any) -> dict[str, ProbeResult]:
    """Every scope's probes (module docstring), for the whole shard at once (``diff``: the shard's,
    a ``scope_path`` on every row).  ``config``: the run's configuration (``gate`` and ``recall``)."""
    gate, recall = config.gate, config.recall
    scopes = list(shard.scope_paths)
    none = {s: ProbeResult(0, 0, 0, False, "nothing_removed", {}) for s in scopes}
    if not gate.probes or not diff.has_changes:
        return none
    cand = _candidates(shard, diff)
    if not cand.height:
        return none
    stop = list(STOP_WORDS)
    probes = (
        cand.with_columns(pl.concat_str([pl.col("scope_path"), pl.col("id")], separator="|").hash(gate.probe_seed).alias("_h"),
                          _words(pl.col("text")).list.eval(pl.element().filter(~pl.element().is_in(stop)))
                          .list.head(MAX_WORDS).alias("qwords"))
        .filter(pl.col("qwords").list.len() > 0)
        .sort(["scope_path", "_h", "id"])
        .filter(pl.int_range(pl.len()).over("scope_path") < gate.probes)
        .with_row_index("p")
        .select("p", "scope_path", pl.col("id").alias("target"), "carrier", "kind", "qwords")
    )
    if not probes.height:
        return none
    after = diff.fold(shard)
    before_found = _found(shard, probes, gate.k, recall.budget_chars, recall.max_passage_chars, after=False)
    after_found = _found(after, probes, gate.k, recall.budget_chars, recall.max_passage_chars, after=True)
    per = (
        probes.group_by("scope_path").agg(pl.len().alias("n"),
                                          pl.col("p").is_in(before_found.get_column("p").implode()).sum().alias("b"),
                                          pl.col("p").is_in(after_found.get_column("p").implode()).sum().alias("a"))
        .join(cand.group_by("scope_path").len("c"), on="scope_path")
        .join(_memory(shard), on="scope_path", how="left")
    )
    kinds = {s: dict(sorted(zip(ks, cs))) for s, ks, cs in
             probes.group_by("scope_path", "kind").len().group_by("scope_path")
             .agg(pl.col("kind"), pl.col("len")).iter_rows()}
    out = dict(none)
    for s, n, b, a, c, m in per.select("scope_path", "n", "b", "a", "c", "m").iter_rows():
        result = ProbeResult(int(n), int(b), int(a), False, "measured" if b else "zero_before", kinds.get(s, {}),
                             int(c), int(m or 0))
        out[s] = replace(result, failed=bool(b) and result.drop_pp > gate.probe_max_drop_pp
                         and result.lost >= gate.probe_min_lost)
    return out


def _memory(shard: Shard) -> pl.DataFrame:
    """(scope_path, m): the scope's nodes and events — what recall searches in it."""
    parts = [shard.table(t).group_by("scope_path").len("m") for t in ("memory_nodes", "episodic_events")
             if shard.table(t).height]
    if not parts:
        return pl.DataFrame(schema={"scope_path": pl.String, "m": pl.UInt32})
    return pl.concat(parts).group_by("scope_path").agg(pl.col("m").sum())
