"""Phase D2 — label_recalls: implicit training labels for recalls nobody gave feedback on (SPEC §3).

A recall (one ``recall_events`` row per returned hit, written by :func:`deep_sleep.online.recall.recall`)
is *used* if the conversation comes back to it: a word of its query shows up again in working
memory or in an episodic event created after the recall.

Words are maximal runs of letters (Unicode ``\\p{L}``, so digits and ``_`` split them), casefolded
to lower case, at least 3 letters long, not in :data:`STOP_WORDS`.  A word "shows up" in a text
when the text's own word set contains it (whole words: ``bill`` does not match ``billing``).
The text of a working-memory node is its label plus the string values of its properties (JSON
keys are left out: ``ttl_hours`` must not make ``hours`` appear everywhere); of an event, its
content.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import polars as pl
from deep_sleep.transforms._common import PhaseResult, scope_paths, scoped_result, scopes_without, skip
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class LabelRecallsConfig(PhaseConfig):
    min_label: float = Field(0.5, ge=0, le=1)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("recalls_labelled",)


PHASE = "label_recalls"
NO_RECALLS = "missing input: no recall events"
IMPLICIT = "implicit"
EXPLICIT = "explicit"
MIN_WORD = 3
WORD = r"\p{L}{3,}"  # polars (Rust regex) form
WORD_RE = re.compile(r"[^\W\d_]{3,}")  # Python form of the same thing
STOP_WORDS = frozenset(
    """
    about above after again against all also and any are around because been before being below between
    both but can cannot could did does doing done down during each else even ever every few for from
    further get gets got had has have having her here hers herself him himself his how however into
    its itself just like made make many more most much must myself not now off once only other our
    ours ourselves out over own per please same she should since some still such than that the their
    theirs them themselves then there these they this those though through too under until upon very
    via was way were what whatever when where whether which while who whom whose why will with within
    without would yes yet you your yours yourself yourselves tell show give know need want let say
    said thing things something anything nothing really
    """.split()
)
# JSON object keys ("key": ) — removed before a node's properties are searched for words.
JSON_KEY = r'"(?:[^"\\]|\\.)*"\s*:'


def query_words(text: str) -> list[str]:
    """The words of ``text`` that count (see the module docstring), in order, without repeats.

    >>> query_words("What about the Billing-API deploy, 2nd try?")
    ['billing', 'api', 'deploy', 'try']
    """
    seen: dict[str, None] = {}
    for w in WORD_RE.findall(text.lower()):
        if w not in STOP_WORDS:
            seen.setdefault(w)
    return list(seen)


def _words(text: pl.Expr) -> pl.Expr:
    return text.str.to_lowercase().str.extract_all(WORD)


def _evidence(snapshot: Snapshot | Shard, words: pl.Series, spans: pl.DataFrame) -> pl.DataFrame:
    """(scope_path, word, at), sorted by ``at``: the words of ``words`` found in a working-memory node
    or episodic event of a scope of ``spans`` (``scope_path``, ``after``, ``until``) created in that
    scope's ``(after, until]``.

    Only texts in that span can be the first evidence of a recall that counts, and only the queries'
    words can match, so nothing else is tokenized or kept (the queries' words already exclude stop words;
    on a shard they are all scopes' words: one a scope did not ask for is never joined to its recalls).
    """
    nodes = snapshot.table("memory_nodes").lazy().filter(pl.col("layer") == "working")
    events = snapshot.table("episodic_events").lazy()
    if spans.height == 1:  # one scope: literals, no join
        scope, after, until = spans.row(0)
        span = (pl.col("created_at") > after) & (pl.col("created_at") <= until)
        if len(scope_paths(snapshot)) > 1:
            span = span & (pl.col("scope_path") == scope)
        nodes, events = nodes.filter(span), events.filter(span)
    else:
        span = (pl.col("created_at") > pl.col("after")) & (pl.col("created_at") <= pl.col("until"))
        nodes, events = (f.join(spans.lazy(), on="scope_path").filter(span) for f in (nodes, events))
    node_text = pl.concat_str(
        [pl.col("label").fill_null(""), pl.col("properties").fill_null("").str.replace_all(JSON_KEY, " ")], separator=" "
    )
    docs = pl.concat(
        [
            nodes.select("scope_path", _words(node_text).alias("word"), pl.col("created_at").alias("at")),
            events.select("scope_path", _words(pl.col("content").fill_null("")).alias("word"), pl.col("created_at").alias("at")),
        ]
    )
    return (
        docs.explode("word")
        .filter(pl.col("word").is_in(words.implode()))
        .sort("at")  # repeats are harmless to the as-of join, and cheaper kept than removed
        .collect()
    )


def label_recalls(snapshot: Snapshot | Shard, config: LabelRecallsConfig, as_of: datetime, lookback_hours: float) -> PhaseResult:
    """Label every unlabelled recall created at or before ``as_of``.

    Used — a word of its query appears in a working-memory node or episodic event created in
    ``(recall.created_at, min(recall.created_at + lookback_hours, as_of)]`` — gives
    ``label = max(similarity, min_label)``; otherwise ``label = similarity / 2``.  Both write
    ``label_source = "implicit"``.  A row that has a label (explicit feedback from the online
    path, or an earlier run's label) is never touched, nor is one without a finite similarity.

    The label is given at the first run that sees the recall, with the evidence there is by
    then: a recall a few minutes before ``as_of`` has had little time to come back and is more
    likely labelled unused.  Waiting for its window to close would lose more: working memory
    expires (phase 8 runs first) and old events are summarised away (phase 10).

    On a shard every scope is labelled with its own evidence only (the as-of join is by
    ``scope_path`` and word); a scope without recall events is skipped for "missing input".
    """
    recalls = snapshot.table("recall_events")
    if not recalls.height:
        return skip(NO_RECALLS)
    missing = scopes_without(snapshot, "recall_events", NO_RECALLS) if len(scope_paths(snapshot)) > 1 else {}
    # A recall without a finite similarity has no label to give (quarantine sets NaN/inf ones aside
    # with a reason; a null one from a hand-written snapshot is left alone, so a rerun changes nothing).
    todo = recalls.filter(pl.col("label").is_null() & (pl.col("created_at") <= as_of) & pl.col("similarity").is_finite())
    if not todo.height:
        return scoped_result(Diff.empty(), None, COUNTERS, skipped_scopes=missing)
    horizon = timedelta(hours=lookback_hours)
    asks = (
        todo.select("id", "scope_path", _words(pl.col("query").fill_null("")).alias("word"), "created_at")
        .explode("word")
        .drop_nulls("word")
        .filter(~pl.col("word").is_in(list(STOP_WORDS)))
        # the first evidence strictly after the recall: search from created_at + 1 µs
        .with_columns((pl.col("created_at") + pl.duration(microseconds=1)).alias("after"))
        .sort("after")
    )
    if not asks.height:
        evidence = pl.DataFrame(schema={"scope_path": pl.String, "word": pl.String, "at": recalls.schema["created_at"]})
    else:
        # The first evidence after a recall at t counts only if it lies in (t, min(t + horizon, as_of)]:
        # per scope, only texts after its first recall and up to its last recall's window end matter.
        if len(scope_paths(snapshot)) == 1:
            first, last = asks.get_column("created_at").min(), asks.get_column("created_at").max()
            until = last + horizon if horizon < as_of - last else as_of  # min(), without overflowing a huge horizon
            spans = pl.DataFrame({"scope_path": asks.get_column("scope_path").head(1), "after": [first], "until": [until]})
        else:
            spans = asks.group_by("scope_path").agg(
                pl.col("created_at").min().alias("after"),
                pl.min_horizontal(pl.col("created_at").max() + horizon, pl.lit(as_of)).alias("until"),
            )
        evidence = _evidence(snapshot, asks.get_column("word").unique(), spans)
    used = (
        asks.join_asof(evidence, left_on="after", right_on="at", by=["scope_path", "word"], strategy="forward",
                       check_sortedness=False)
        .filter(pl.col("at").is_not_null() & (pl.col("at") <= pl.min_horizontal(pl.col("created_at") + horizon, pl.lit(as_of))))
        .select("id")
        .unique()
    )
    sim = pl.col("similarity")
    labelled = (
        todo.with_columns(pl.col("id").is_in(used.get_column("id").implode()).alias("_used"))
        .select(
            "id",
            "version",
            pl.when(pl.col("_used")).then(pl.max_horizontal(sim, pl.lit(config.min_label))).otherwise(sim / 2).alias("label"),
            pl.lit(IMPLICIT).alias("label_source"),
            "scope_path",
        )
        .sort("id")
    )
    counts = labelled.group_by("scope_path").agg(pl.len().alias("recalls_labelled"))
    return scoped_result(Diff.of("recall_events", PHASE, updates=labelled.drop("scope_path")), counts, COUNTERS,
                         skipped_scopes=missing)
