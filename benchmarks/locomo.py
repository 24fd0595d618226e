"""LoCoMo replayed through the product: does a night of consolidation leave the agent's memory better?

    python -m benchmarks.locomo                                  # the 5 dev conversations, nights on and off
    python -m benchmarks.locomo --nights on --conversations 1    # one conversation, nights on only
    python -m benchmarks.locomo --data PATH --embedder hashing --out bench-results.json

**Data.**  LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents",
ACL 2024; CC BY-NC 4.0 — attribution, non-commercial use): long conversations between two people over
up to 35 sessions, with questions whose evidence turns (``dia_id``, ``D<session>:<turn>``) are
annotated.  The public file is ``data/locomo10.json`` of https://github.com/snap-research/LoCoMo;
the default here is ``../shared/data/locomo/locomo5_dev.json`` (five of its conversations, the
development split) next to the repository, or ``$LOCOMO_DATA``, or ``--data``.  The project never
vendors the file.

**Protocol** (issue 30's "Why" is the definition; the details below are ours):

- One scope per conversation and mode: ``locomo-nights-on`` / ``locomo-nights-off`` → ``conversation
  <sample_id>`` (``--tenant`` changes the first id, e.g. for tests sharing a database).
- Sessions are replayed in order at their ``session_N_date_time`` ("1:56 pm on 8 May, 2023"), read
  as UTC; the turns of a session are :data:`TURN_GAP` (5 s) apart from that time.
- Before each turn the agent recalls with the turn's text (``recall(k=5, now=<turn time>)``), then
  the turn is recorded with ``record_turn(now=<turn time>, session_id="session_N")`` and the default
  ``nap=True`` (the live path: a quick nap every ``quick_nap_interval`` turns of the scope).  The
  turn's ops: one ``create_event`` whose content is ``"<speaker>: <text>"`` (plus ``" [shares a
  photo: <blip_caption>]"`` when the turn has an image; what a multimodal agent would have heard)
  and metadata ``{dia_id, speaker, session, source: "locomo"}``; and one ``upsert_node`` per
  observation fact the dataset derives from this turn — label the fact's text, properties
  ``{dia_id, speaker, session}``.  A fact is attached to the turn it cites (the first ``dia_id``
  if it cites several), as an agent that extracts facts while it talks would write it; a fact
  citing no turn of its session goes with the session's last turn.  ``dia_id`` is kept as the
  dataset gives it when it is one well-formed id, else as the list of the ids found in it
  (``["D15:3", "D15:5"]``).  A fact text seen twice in a conversation is one node (upsert by
  label), whose ``dia_id`` lists every turn that stated it.  No recall feedback is given (the
  replayed agent does not say which memories it used): labels are the nightly's implicit ones.
- With nights on, the single-scope nightly (:func:`_night`) runs for the scope at the first 03:00
  UTC after each session ends — before any later turn (two sessions ending before the same 03:00
  share that night) — with ``as_of`` = that 03:00.
- QA at ``now`` = one hour after the first 03:00 following the last session (the same instant for
  both modes): every question of categories 1–4 goes through ``recall(scope, question, k=10)``;
  R@5 uses the first five of those ten hits.  A question's evidence is the well-formed ``dia_id``\\ s
  that name a turn of its conversation (``"D8:6; D9:17"`` gives two, ``"D:11:26"`` is ``D11:26``,
  ``"D"`` and ids of no turn are dropped); a question left without evidence is not asked.
- A hit's *provenance*: an observation node's ``dia_id``; an event's ``dia_id``; a summary's
  (``META:episodic_summary``) source events' ``dia_id``\\ s, its ``source_ids`` resolved through
  the events as recorded (ids from the receipts) and the archive (``consolidation_archive``).  A
  question is covered at k when the provenance of one of the top-k hits includes one of its
  evidence turns; its evidence share at k is the fraction of its evidence turns so covered.
  The code reads a hit defensively (``node_id`` or ``id``, an optional ``kind`` and
  ``source_ids``), so it keeps working when recall returns events or says what a hit is.
- Rows per table are counted after the replay and the nights, before QA (QA's recalls add log
  rows).  Held rows are the ledger's (``consolidation_runs.held``), by reason and phase.

**Determinism.**  Two runs of the same command give the same recall figures, rows and held rows
(checked on the dev split), because the benchmark holds two inputs fixed that the product leaves to
chance: the live path's row ids (random UUIDs, which the phases and recall use to break ties) are
drawn from a generator seeded with the scope (:class:`SeededIds`; ``--random-ids`` to turn off),
and recall's nearest neighbours are exact: the benchmark's own database drops the HNSW index on
``memory_nodes.embedding`` (``--hnsw`` keeps it; its graph depends on random levels: two runs with
it found different hits for one question of 760, coverage unchanged).  Measured on the dev split
with both left to chance (``--hnsw --random-ids``, as in production): two runs held 95 and 0 rows
and differed on 7 questions' coverage; ``--random-ids`` alone 0 and 884 held rows, 9 questions.
With ``--dsn`` the database is used as it is (its index kept).  ``protocol.seeded_ids`` and
``protocol.nearest_neighbours`` say which was measured.  ``--naps off`` records turns with ``nap=False`` (no quick naps between nights).

The embedder is the run's one embedder (``--embedder``, else the configuration's ``embedding.model``) and
passed to every ``record_turn`` and ``recall``; the nightly takes none today (it uses the default).

Writes ``bench-results.json`` → ``"locomo"`` (other keys kept): per mode, R@5 / R@10 / mean evidence
share per category and overall, rows at the end, held rows, ledger counters, wall time per part,
p50/p95 of ``record_turn``, live recall and QA recall, and what the top-10 hits were; the lost and
gained questions between the modes and where the lost ones' evidence went; the embedder, the data
file's sha256, the conversation ids and the git commit.  ``--questions-out`` writes one JSON line
per question and mode (its hits and coverage).  A digest of the per-question coverage
(``coverage_digest``) makes two runs easy to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path("..") / "shared" / "data" / "locomo" / "locomo5_dev.json"
PUBLIC_SOURCE = "https://github.com/snap-research/LoCoMo (data/locomo10.json, CC BY-NC 4.0)"
DATABASE = "deep_sleep_bench_locomo"
TURN_GAP = timedelta(seconds=5)
NIGHT_HOUR = 3  # UTC
LIVE_K = 5
QA_K = 10
KS = (5, 10)
#: Source turns a summary hit stands for in the stricter reading (:func:`passages`).
PASSAGES = 3
CATEGORIES = (1, 2, 3, 4)
#: Reading budgets (characters) at which evidence found is reported: what a reader meets within the
#: first B characters of the ranked hits (:func:`segments`, :func:`found_within`).
BUDGETS = (1200, 2400, 4800)
#: QA recalls with no budget of their own: the budgets above are prefixes of its ranked hits.
UNBOUNDED = 1_000_000
#: The modes: (quick naps, nights).  ``none`` is no consolidation at all.
MODES = {"none": (False, False), "naps": (True, False), "nights": (True, True)}
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SUMMARY_LABEL = "META:episodic_summary"
HNSW_INDEX = "memory_nodes_embedding_hnsw"
TABLES = ("memory_nodes", "memory_edges", "episodic_events", "memory_access_log", "recall_events",
          "procedural_skills", "prospective_triggers", "soul_profiles", "pending_connections",
          "reranker_models", "consolidation_runs", "consolidation_archive")


def _embedder_names() -> list[str]:
    from deep_sleep.core.embedding import MODELS

    return sorted(MODELS)


def _p(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _pct(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]  # noqa: E731
    return {"n": len(xs), "p50": round(pick(0.50), 2), "p95": round(pick(0.95), 2), "max": round(xs[-1], 2)}


# ---------------------------------------------------------------------------------------------
# the data

_DIA = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %d %B %Y", "%H:%M on %d %B, %Y")


def dia_ids(value: Any) -> list[str]:
    """The well-formed ``D<session>:<turn>`` ids in a dataset value (a string, or a list of them;
    anything else gives none), in order, without repeats.

    >>> dia_ids("D1:3"), dia_ids("D8:6; D9:17"), dia_ids("D:11:26"), dia_ids("D"), dia_ids(["D15:3", "D15:5"])
    (['D1:3'], ['D8:6', 'D9:17'], ['D11:26'], [], ['D15:3', 'D15:5'])
    """
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            for a, b in _DIA.findall(item):
                d = f"D{int(a)}:{int(b)}"
                if d not in out:
                    out.append(d)
    return out


def parse_when(text: str) -> datetime:
    """A LoCoMo session date-time, read as UTC.

    >>> parse_when("1:56 pm on 8 May, 2023").isoformat()
    '2023-05-08T13:56:00+00:00'
    """
    norm = " ".join(str(text).replace(",", ", ").split()).replace(" ,", ",")
    norm = re.sub(r"\b(am|pm)\b", lambda m: m.group(1).upper(), norm, flags=re.I)
    for fmt in _DATE_FORMATS:
        with contextlib.suppress(ValueError):
            return datetime.strptime(norm, fmt).replace(tzinfo=UTC)
    raise ValueError(f"unreadable session date-time {text!r}")


@dataclass
class Turn:
    dia_id: str
    speaker: str
    content: str
    when: datetime
    facts: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (fact, speaker, dia_ids)


@dataclass
class Session:
    number: int
    start: datetime
    turns: list[Turn]

    @property
    def end(self) -> datetime:
        return self.turns[-1].when if self.turns else self.start


@dataclass
class Question:
    index: int
    question: str
    category: int
    evidence: list[str]


@dataclass
class Conversation:
    sample_id: str
    sessions: list[Session]
    questions: list[Question]
    skipped_questions: int = 0
    dropped_evidence: list[str] = field(default_factory=list)
    facts: int = 0


def _turn_content(turn: dict) -> str:
    text = " ".join(str(turn.get("text") or "").split())
    caption = " ".join(str(turn.get("blip_caption") or "").split())
    content = f"{turn.get('speaker', '?')}: {text}"
    return content + (f" [shares a photo: {caption}]" if caption else "")


def load_conversations(path: Path, limit: int | None = None) -> list[Conversation]:
    """The file's conversations (the first ``limit``), as the replay needs them."""
    samples = json.loads(Path(path).read_text())
    out = []
    for sample in samples[:limit] if limit else samples:
        conv = sample["conversation"]
        numbers = sorted(int(m.group(1)) for k in conv for m in [re.fullmatch(r"session_(\d+)", k)] if m)
        sessions: list[Session] = []
        for n in numbers:
            raw = [t for t in conv[f"session_{n}"] if isinstance(t, dict) and str(t.get("text") or "").strip()]
            if not raw:
                continue
            start = parse_when(conv[f"session_{n}_date_time"])
            turns = [Turn(str(t.get("dia_id")), str(t.get("speaker", "?")), _turn_content(t), start + i * TURN_GAP)
                     for i, t in enumerate(raw)]
            sessions.append(Session(n, start, turns))
        sessions.sort(key=lambda s: (s.start, s.number))
        by_dia = {t.dia_id: t for s in sessions for t in s.turns}
        facts = 0
        for s in sessions:
            observed = (sample.get("observation") or {}).get(f"session_{s.number}_observation") or {}
            for speaker, items in observed.items():
                for item in items or []:
                    if not (isinstance(item, (list, tuple)) and item and isinstance(item[0], str) and item[0].strip()):
                        continue
                    fact = " ".join(item[0].split())
                    cited = dia_ids(item[1] if len(item) > 1 else None)
                    home = next((by_dia[d] for d in cited if d in by_dia and by_dia[d] in s.turns), s.turns[-1])
                    home.facts.append((fact, speaker, cited))
                    facts += 1
        questions, skipped, dropped = [], 0, []
        for i, q in enumerate(sample.get("qa") or []):
            if q.get("category") not in CATEGORIES:
                continue
            raw_ev = [e for v in (q.get("evidence") or []) for e in ([v] if isinstance(v, str) else [])]
            ev = [d for d in dia_ids(raw_ev) if d in by_dia]
            dropped += [e for e in raw_ev if not set(dia_ids(e)) & set(ev)]
            if not ev:
                skipped += 1
                continue
            questions.append(Question(i, str(q["question"]), int(q["category"]), ev))
        out.append(Conversation(str(sample["sample_id"]), sessions, questions, skipped, dropped, facts))
    return out


def next_night(t: datetime) -> datetime:
    """The first 03:00 UTC strictly after ``t``."""
    night = t.replace(hour=NIGHT_HOUR, minute=0, second=0, microsecond=0)
    return night if night > t else night + timedelta(days=1)


# ---------------------------------------------------------------------------------------------
# the replay


class SeededIds:
    """Stands in for the ``uuid`` module inside :mod:`deep_sleep.online.turn` and
    :mod:`deep_sleep.online.recall` (``--random-ids`` turns it off): their ``uuid4()`` draws from a
    generator seeded with the scope's path, everything else is the real module.  The live path
    gives its rows random ids, and the phases break ties by id (phase 1.5 picks each node's
    partners among equally near ones by id; phase 4 its members), so without this two identical
    replays differ (measured: 382 vs 383 ``CO_OCCURRED`` edges on one conversation)."""

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def seed(self, key: str) -> None:
        self.rng = random.Random(hashlib.sha256(key.encode()).digest())

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)

    def __getattr__(self, name: str) -> Any:
        return getattr(uuid, name)


@contextlib.contextmanager
def seeded_ids(enabled: bool):
    """The :class:`SeededIds` in place while the block runs (``None`` when not ``enabled``)."""
    import importlib

    # importlib: the package exports functions of the same names as these modules
    turn_mod = importlib.import_module("deep_sleep.online.turn")
    recall_mod = importlib.import_module("deep_sleep.online.recall")
    if not enabled:
        yield None
        return
    shim, saved = SeededIds(), (turn_mod.uuid, recall_mod.uuid)
    turn_mod.uuid = recall_mod.uuid = shim
    try:
        yield shim
    finally:
        turn_mod.uuid, recall_mod.uuid = saved


def _night(store, scope, as_of: datetime, runs_dir: Path, config):
    """One scope's night: the public entry point (:func:`deep_sleep.run.pipeline.consolidate`)."""
    from deep_sleep.run.pipeline import consolidate

    return consolidate(store, scope, as_of, config, runs_dir=runs_dir).report()


@dataclass
class Replay:
    """What a conversation's replay recorded: event id → dia_id (``None`` for a turn-summary event)."""

    event_dia: dict[str, str | None] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=lambda: {
        "record_turn": [], "record_turn_without_nap": [], "record_turn_with_nap": [], "live_recall": [], "night": []})
    seconds: dict[str, float] = field(default_factory=lambda: {"replay": 0.0, "nights": 0.0})
    nights: int = 0
    night_statuses: Counter = field(default_factory=Counter)
    gate: Counter = field(default_factory=Counter)  # the nights' gate verdicts: status, failed, probe figures
    nap_statuses: Counter = field(default_factory=Counter)
    rejected: list[str] = field(default_factory=list)


def _facts_ops(turn: Turn, session: int, stated: dict[str, list[str]]) -> list[dict]:
    """One upsert per fact of the turn; a fact stated before keeps every turn it cited."""
    merged: dict[str, dict] = {}
    for fact, speaker, cited in turn.facts:
        ids = stated.setdefault(fact, [])
        ids += [d for d in cited if d not in ids]
        merged[fact] = {"dia_id": (ids[0] if len(ids) == 1 else list(ids)) if ids else None, "speaker": speaker,
                        "session": session}
    return [{"op": "upsert_node", "label": fact, "properties": props} for fact, props in merged.items()]


def replay(store, con: psycopg.Connection, scope, conv: Conversation, nights: bool, config, embedder,
           runs_dir: Path, naps: bool = True) -> Replay:
    from deep_sleep.online import recall, record_turn

    rep = Replay()
    pending: list[datetime] = []
    stated: dict[str, list[str]] = {}

    def run_nights(until: datetime | None) -> None:
        while pending and (until is None or pending[0] <= until):
            as_of = pending.pop(0)
            t = time.perf_counter()
            report = _night(store, scope, as_of, runs_dir, config)
            dt = time.perf_counter() - t
            rep.times["night"].append(dt * 1000)
            rep.seconds["nights"] += dt
            rep.nights += 1
            rep.night_statuses[report.status] += 1
            gate = report.gate or {}
            rep.gate[f"status {gate.get('status')}"] += 1
            rep.gate["failed"] += int(bool(gate.get("failed")))
            probes = gate.get("probes") or {}
            for key in ("probes", "found_before", "found_after"):
                rep.gate[f"probes {key}"] += int(probes.get(key) or 0)
            folds = report.counters.get("episodes_summarized", 0) + report.counters.get("nodes_pruned", 0)
            rep.gate["nights that fold or prune"] += int(folds > 0)
            rep.gate["of those measured"] += int(folds > 0 and gate.get("status") == "measured")

    for s in conv.sessions:
        t_session = time.perf_counter()
        nights_before = rep.seconds["nights"]
        for turn in s.turns:
            if nights:
                run_nights(turn.when)
            t = time.perf_counter()
            recall(con, scope, turn.content, k=LIVE_K, now=turn.when, embedder=embedder, config=config)
            rep.times["live_recall"].append((time.perf_counter() - t) * 1000)
            ops = [{"op": "create_event", "content": turn.content,
                    "metadata": {"dia_id": turn.dia_id, "speaker": turn.speaker, "session": s.number, "source": "locomo"}}]
            ops += _facts_ops(turn, s.number, stated)
            t = time.perf_counter()
            receipt = record_turn(con, scope, ops, now=turn.when, session_id=f"session_{s.number}", config=config,
                                  embedder=embedder, nap=naps)
            ms = (time.perf_counter() - t) * 1000
            rep.times["record_turn"].append(ms)  # as the caller waits for it: with the quick nap it ran, if any
            rep.times["record_turn_with_nap" if receipt.quick_nap is not None else "record_turn_without_nap"].append(ms)
            rep.rejected += [f"{turn.dia_id} {r.op}: {r.reason}" for r in receipt.rejected]
            own = {x.id: turn.dia_id for x in receipt.landed if x.op == "create_event"}
            rep.event_dia.update(own)
            if receipt.summary_event_id not in own:  # a turn-summary event of its own: no turn's text
                rep.event_dia[receipt.summary_event_id] = None
            if receipt.quick_nap is not None:
                rep.nap_statuses[receipt.quick_nap.status] += 1
        if nights:
            pending.append(next_night(s.end))
            pending.sort()
        rep.seconds["replay"] += time.perf_counter() - t_session - (rep.seconds["nights"] - nights_before)
        _p(f"  {conv.sample_id} [naps {'on' if naps else 'off'}, nights {'on' if nights else 'off'}] session {s.number} ({s.start:%Y-%m-%d}): "
           f"{len(s.turns)} turns, {sum(len(t.facts) for t in s.turns)} facts; nights so far {rep.nights}")
    if nights:
        run_nights(None)
    return rep


# ---------------------------------------------------------------------------------------------
# provenance and coverage


@dataclass
class Provenance:
    """Where the rows a hit may name came from: id → kind and the dia_ids it stands for.

    kinds: ``observation`` (a node citing turns), ``summary`` (``META:episodic_summary``),
    ``cluster`` (another ``META:`` node), ``event``, ``working``, ``node`` (anything else)."""

    event_dia: dict[str, str | None] = field(default_factory=dict)
    rows: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def of_sources(self, ids: Iterable[Any]) -> tuple[str, ...]:
        """The dia_ids of a hit's sources: events (a summary's), or nodes (a cluster's members)."""
        out: list[str] = []
        for i in ids or ():
            ds = [self.event_dia.get(str(i))] if str(i) in self.event_dia else list(self.rows.get(str(i), (None, ()))[1])
            out += [d for d in ds if d and d not in out]
        return tuple(out)

    def of_hit(self, hit: Any) -> tuple[str, tuple[str, ...]]:
        """(kind, dia_ids) of a recall hit: by its id, else by what the hit says of itself."""
        hid = str(getattr(hit, "node_id", None) or getattr(hit, "id", None) or getattr(hit, "event_id", None) or "")
        said = getattr(hit, "kind", None)
        kind, dias = self.rows.get(hid, (None, ()))
        if kind is None:
            if said == "event" or hid in self.event_dia:
                kind, dias = "event", tuple(d for d in [self.event_dia.get(hid)] if d)
            else:
                label = str(getattr(hit, "label", "") or "")
                kind = str(said) if said else ("summary" if label == SUMMARY_LABEL else "cluster" if label.startswith("META:") else "node")
        sources = getattr(hit, "source_ids", None)
        if sources:
            dias = tuple(dict.fromkeys(dias + self.of_sources(sources)))
        return kind, dias


def _node_kind(label: str, layer: str, props: dict) -> str:
    if label == SUMMARY_LABEL:
        return "summary"
    if label.startswith("META:"):
        return "cluster"
    if layer == "working":
        return "working"
    return "observation" if "dia_id" in props else "node"


def provenance(con: psycopg.Connection, scope_path: str, event_dia: dict[str, str | None]) -> Provenance:
    """The scope's nodes and events (live and archived) with their dia_ids."""
    prov = Provenance(dict(event_dia))
    archived = con.execute(
        "SELECT a.row_id, a.row -> 'metadata' FROM consolidation_archive a JOIN consolidation_runs r USING (run_id)"
        " WHERE r.scope_path = %s AND a.table_name = 'episodic_events'", (scope_path,)).fetchall()
    live = con.execute("SELECT id::text, metadata FROM episodic_events WHERE scope_path = %s", (scope_path,)).fetchall()
    for eid, meta in [*archived, *live]:
        meta = json.loads(meta) if isinstance(meta, str) else (meta or {})
        d = meta.get("dia_id") if isinstance(meta, dict) else None
        prov.event_dia.setdefault(str(eid), d)
    for eid, _ in live:
        prov.rows[str(eid)] = ("event", tuple(d for d in [prov.event_dia.get(str(eid))] if d))
    for nid, label, layer, props in con.execute(
            "SELECT id::text, label, layer, properties FROM memory_nodes WHERE scope_path = %s", (scope_path,)):
        props = props if isinstance(props, dict) else {}
        kind = _node_kind(label, layer, props)
        dias = tuple(dia_ids(props.get("dia_id"))) if kind == "observation" else ()
        if kind == "summary":
            dias = prov.of_sources(props.get("source_ids") or ())
        prov.rows[nid] = (kind, dias)
    return prov


def coverage(evidence: list[str], hit_dias: list[tuple[str, ...]], k: int) -> tuple[bool, float]:
    """(covered, evidence share) of a question at ``k`` given its hits' provenance, best first.

    >>> coverage(["D1:3", "D2:4"], [(), ("D2:4",), ("D1:3",)], 2), coverage(["D1:3"], [(), ("D1:3",)], 1)
    ((True, 0.5), (False, 0.0))
    """
    found = {d for dias in hit_dias[:k] for d in dias} & set(evidence)
    return bool(found), len(found) / len(evidence)


def segments(hit: Any, dias: tuple[str, ...], prov: Provenance) -> list[tuple[int, tuple[str, ...]]]:
    """What a reader meets in a hit's text, in reading order: ``(end offset within the text, dia_ids)``
    per part.  A hit that quotes source lines (``lines``: a summary's folded turns, a cluster's
    members, each with its id) is read line by line after its gist (which carries no turn); an
    older summary hit (its text the events' contents one per line, in ``source_ids`` order) likewise;
    any other hit is one part carrying its whole provenance ``dias``, met at its end.

    >>> class L: source_id, text = "e2", "b: the cat"
    >>> class H: kind, text, lines = "summary", "gist\\nb: the cat", (L,)
    >>> segments(H, (), Provenance({"e2": "D1:2"}))
    [(4, ()), (15, ('D1:2',))]
    """
    text = str(getattr(hit, "text", "") or "")
    lines = tuple(getattr(hit, "lines", ()) or ())
    if lines:
        gist_end = len(text) - sum(len(getattr(ln, "text", "")) + 1 for ln in lines)
        out, at = [(max(gist_end, 0), ())], max(gist_end, 0)
        for ln in lines:
            at += len(getattr(ln, "text", "")) + 1
            out.append((at, prov.of_sources([getattr(ln, "source_id", None)])))
        return out
    if getattr(hit, "kind", None) == "summary":
        ids = tuple(getattr(hit, "source_ids", ()) or ())
        out, at = [], 0
        for i, line in enumerate(text.split("\n")):
            at += len(line) + (1 if i else 0)
            out.append((at, prov.of_sources([ids[i]]) if i < len(ids) else ()))
        return out
    return [(len(text), dias)]


def found_within(evidence: list[str], hit_parts: list[list[tuple[int, tuple[str, ...]]]], hit_chars: list[int],
                 budget: int) -> bool:
    """Whether a part carrying one of ``evidence``'s turns ends within the first ``budget`` characters
    of the ranked hits (each hit's parts offset by the characters of the hits before it).

    >>> found_within(["D1:2"], [[(100, ("D1:1",))], [(10, ()), (60, ("D1:2",))]], [100, 60], 150)
    False
    >>> found_within(["D1:2"], [[(100, ("D1:1",))], [(10, ()), (60, ("D1:2",))]], [100, 60], 160)
    True
    """
    ev, before = set(evidence), 0
    for parts, chars in zip(hit_parts, hit_chars):
        for end, dias in parts:
            if before + end > budget:
                return False
            if ev & set(dias):
                return True
        before += chars
    return False


def qa(con: psycopg.Connection, scope, conv: Conversation, prov: Provenance, now: datetime, embedder,
       config=None) -> tuple[list[dict], list[float]]:
    import inspect

    from deep_sleep.online import recall

    unbounded = {"budget_chars": UNBOUNDED} if "budget_chars" in inspect.signature(recall).parameters else {}
    rows, times = [], []
    for q in conv.questions:
        t = time.perf_counter()
        hits = recall(con, scope, q.question, k=QA_K, now=now, embedder=embedder, config=config, **unbounded)
        times.append((time.perf_counter() - t) * 1000)
        seen = [prov.of_hit(h) for h in hits]
        row = {"conversation": conv.sample_id, "qa_index": q.index, "category": q.category, "evidence": q.evidence,
               "hits": [{"id": str(getattr(h, "node_id", None) or getattr(h, "id", "")), "kind": kind, "dia_ids": list(d)}
                        for h, (kind, d) in zip(hits, seen)]}
        for k in KS:
            covered, share = coverage(q.evidence, [d for _, d in seen], k)
            row[f"covered@{k}"], row[f"share@{k}"] = covered, share
        row["passage_covered@10"] = coverage(q.evidence, [passages(q.question, h, d, prov) for h, (_, d) in zip(hits, seen)], 10)[0]
        chars = [len(str(getattr(h, "text", "") or "")) for h in hits]
        parts = [segments(h, d, prov) for h, (_, d) in zip(hits, seen)]
        row["chars@10"] = sum(chars[:QA_K])
        for h, c, pt in zip(row["hits"], chars, parts):  # what a reader meets of each hit
            h["chars"], h["read"] = c, sorted({d for _, ds in pt for d in ds})
        for b in BUDGETS:
            row[f"found@{b}"] = found_within(q.evidence, parts, chars, b)
        rows.append(row)
    return rows, times


_WORD = re.compile(r"[^\W_]+")


def passages(question: str, hit: Any, dias: tuple[str, ...], prov: Provenance, n: int = PASSAGES) -> tuple[str, ...]:
    """The stricter reading of a hit's provenance (``r_at_10_passages``): a summary stands for only the
    ``n`` source events whose lines of its text share the most words with the question (ties: text
    order) — the turns a reader of the hit would find — rather than all of its up to 50; any other hit
    for its whole provenance ``dias``.  A summary's text is its events' contents one per line, in
    ``source_ids`` order.

    >>> class H: kind, text, source_ids = "summary", "a: dogs\\nb: the cat sat\\nc: cats", ("e1", "e2", "e3")
    >>> passages("where is the cat", H, (), Provenance({"e1": "D1:1", "e2": "D1:2", "e3": "D1:3"}), n=1)
    ('D1:2',)
    """
    if getattr(hit, "kind", None) != "summary":
        return dias
    words = {w.lower() for w in _WORD.findall(question)}
    ids = tuple(getattr(hit, "source_ids", ()) or ())
    lines = str(getattr(hit, "text", "") or "").split("\n")[:len(ids)]
    best = sorted(range(len(lines)), key=lambda i: (-len(words & {w.lower() for w in _WORD.findall(lines[i])}), i))[:n]
    return prov.of_sources([ids[i] for i in sorted(best)])


def summarize(rows: list[dict]) -> dict[str, Any]:
    """R@k and mean evidence share at k, per category and overall."""
    def figures(rs: list[dict]) -> dict[str, Any]:
        out: dict[str, Any] = {"questions": len(rs)}
        for k in KS:
            out[f"r_at_{k}"] = round(sum(r[f"covered@{k}"] for r in rs) / len(rs), 4) if rs else None
            out[f"share_at_{k}"] = round(sum(r[f"share@{k}"] for r in rs) / len(rs), 4) if rs else None
        out["r_at_10_passages"] = round(sum(r.get("passage_covered@10", False) for r in rs) / len(rs), 4) if rs else None
        for b in BUDGETS:
            out[f"found_within_{b}"] = round(sum(r.get(f"found@{b}", False) for r in rs) / len(rs), 4) if rs else None
        chars = sorted(r.get("chars@10", 0) for r in rs)
        out["median_chars_at_10"] = chars[len(chars) // 2] if chars else None
        return out

    by_cat = {str(c): {"name": CATEGORY_NAMES[c], **figures([r for r in rows if r["category"] == c])} for c in CATEGORIES}
    return {"overall": figures(rows), "by_category": by_cat}


def coverage_digest(rows: list[dict]) -> str:
    key = sorted((r["conversation"], r["qa_index"], r["covered@5"], r["covered@10"], round(r["share@5"], 6),
                  round(r["share@10"], 6), [h["id"] for h in r["hits"]]) for r in rows)
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# the store at the end


def rows_at_end(con: psycopg.Connection, paths: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for table in TABLES:
        if table == "consolidation_archive":
            sql = ("SELECT count(*) FROM consolidation_archive a JOIN consolidation_runs r USING (run_id)"
                   " WHERE r.scope_path = ANY(%s)")
        else:
            sql = f"SELECT count(*) FROM {table} WHERE scope_path = ANY(%s)"
        out[table] = con.execute(sql, (paths,)).fetchone()[0]
    kinds: Counter = Counter()
    embedded: Counter = Counter()
    for label, layer, props, has_vec in con.execute(
            "SELECT label, layer, properties, embedding IS NOT NULL FROM memory_nodes WHERE scope_path = ANY(%s)", (paths,)):
        kind = _node_kind(label, layer, props if isinstance(props, dict) else {})
        kinds[kind] += 1
        embedded[kind] += bool(has_vec)
    out["nodes_by_kind"] = dict(sorted(kinds.items()))
    out["nodes_with_embedding_by_kind"] = dict(sorted(embedded.items()))
    out["events_by_kind"] = dict(con.execute(
        "SELECT CASE WHEN metadata ->> 'kind' = 'turn_summary' THEN 'turn_summary' ELSE 'turn' END AS k, count(*)"
        " FROM episodic_events WHERE scope_path = ANY(%s) GROUP BY 1 ORDER BY 1", (paths,)).fetchall())
    out["edges_by_relation"] = dict(con.execute(
        "SELECT relation, count(*) FROM memory_edges WHERE scope_path = ANY(%s) GROUP BY 1 ORDER BY 1", (paths,)).fetchall())
    imp = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE importance <= 1.0), count(*) FILTER (WHERE importance < 4.0),"
        " round(avg(importance)::numeric, 3) FROM memory_nodes WHERE scope_path = ANY(%s) AND properties ? 'dia_id'",
        (paths,)).fetchone()
    out["observation_importance"] = {"nodes": imp[0], "at_floor_1.0": imp[1], "below_4.0": imp[2],
                                     "mean": float(imp[3]) if imp[3] is not None else None}
    folded = con.execute("SELECT to_regclass('episodic_folded') IS NOT NULL").fetchone()[0]
    out["episodic_folded"] = con.execute(
        "SELECT count(*) FROM episodic_folded WHERE scope_path = ANY(%s)", (paths,)).fetchone()[0] if folded else 0
    # what recall scans and ranks per query: the rows of its word and vector indexes (nodes, hot events);
    # episodic_folded is read only through a summary hit (by summary_id), never searched
    out["rows_recall_searches_per_scope"] = round((out["memory_nodes"] + out["episodic_events"]) / max(len(paths), 1), 1)
    text = {
        "events": "SELECT coalesce(sum(length(content)), 0) FROM episodic_events WHERE scope_path = ANY(%s)",
        "summaries": ("SELECT coalesce(sum(length(coalesce(properties->>'summary', ''))), 0) FROM memory_nodes"
                      " WHERE scope_path = ANY(%s) AND label = 'META:episodic_summary'"),
        "summary_keywords": ("SELECT coalesce(sum(length(coalesce(properties->>'keywords', ''))), 0) FROM memory_nodes"
                             " WHERE scope_path = ANY(%s) AND label = 'META:episodic_summary'"),
        "archive_events": ("SELECT coalesce(sum(length(a.row->>'content')), 0) FROM consolidation_archive a"
                           " JOIN consolidation_runs r USING (run_id) WHERE r.scope_path = ANY(%s)"
                           " AND a.table_name = 'episodic_events'"),
    }
    if folded:
        text["folded"] = "SELECT coalesce(sum(length(content)), 0) FROM episodic_folded WHERE scope_path = ANY(%s)"
    out["text_chars"] = {k: int(con.execute(q, (paths,)).fetchone()[0]) for k, q in text.items()}
    return out


def ledger(con: psycopg.Connection, paths: list[str], max_drop_pp: float) -> dict[str, Any]:
    """Runs, counters, held rows (by reason, phase, table) and gate figures, per mode."""
    out: dict[str, Any] = {}
    for mode, status, hold_status, counters, held, before, after in con.execute(
            "SELECT mode, status, hold_status, counters, held, recall_before, recall_after FROM consolidation_runs"
            " WHERE scope_path = ANY(%s) ORDER BY as_of, run_id", (paths,)):
        m = out.setdefault(mode, {"runs": 0, "status": Counter(), "hold_status": Counter(), "counters": Counter(),
                                  "held_rows": 0, "held_by_reason": Counter(), "held_by_phase": Counter(),
                                  "held_by_table": Counter(), "gate_measured": 0, "gate_failed": 0})
        m["runs"] += 1
        m["status"][status] += 1
        m["hold_status"][hold_status] += 1
        m["counters"].update({k: v for k, v in (counters or {}).items() if isinstance(v, (int, float)) and v})
        held = held or {}
        m["held_rows"] += sum((held.get("reasons") or {}).values())
        m["held_by_reason"].update(held.get("reasons") or {})
        m["held_by_phase"].update(held.get("phases") or {})
        for table, kinds in (held.get("rows") or {}).items():
            for kind, n in kinds.items():
                m["held_by_table"][f"{table}.{kind}"] += n
        if before is not None:
            m["gate_measured"] += 1
            # SPEC §9: the gate fails when recall@k drops by more than gate.max_drop_pp
            m["gate_failed"] += int(after is not None and 100 * (before - after) > max_drop_pp)
    return {mode: {k: dict(sorted(v.items())) if isinstance(v, Counter) else v for k, v in m.items()}
            for mode, m in sorted(out.items())}


def deletions(con: psycopg.Connection, paths: list[str]) -> dict[str, Any]:
    """Nodes the runs deleted, by kind and by the reason the archive gives (its first words)."""
    out: Counter = Counter()
    for label, props, reason in con.execute(
            "SELECT a.row ->> 'label', a.row -> 'properties', a.reason FROM consolidation_archive a"
            " JOIN consolidation_runs r USING (run_id) WHERE r.scope_path = ANY(%s) AND a.table_name = 'memory_nodes'"
            " AND a.op = 'delete'", (paths,)):
        props = json.loads(props) if isinstance(props, str) else (props or {})
        kind = _node_kind(label or "", "semantic", props if isinstance(props, dict) else {})
        out[f"{kind}: {' '.join(str(reason or '?').split()[:3])}"] += 1
    return dict(sorted(out.items()))


def losses(con: psycopg.Connection, on_rows: list[dict], off_rows: list[dict], on_paths: dict[str, str]) -> dict[str, Any]:
    """Questions covered at 10 with nights off and not on (lost), and the reverse (gained).  For
    each lost one: is an observation node citing its evidence still in the nights-on scope (then
    it was ranked out; its importance is noted), only archived (deleted, by which run's reason),
    or never there?"""
    off = {(r["conversation"], r["qa_index"]): r for r in off_rows}
    lost, gained = [], 0
    for r in on_rows:
        o = off.get((r["conversation"], r["qa_index"]))
        if o is None:
            continue
        if o["covered@10"] and not r["covered@10"]:
            lost.append(r)
        gained += int(r["covered@10"] and not o["covered@10"])
    why: Counter = Counter()
    importance: list[float] = []
    for r in lost:
        path, ev = on_paths[r["conversation"]], r["evidence"]
        found = con.execute(
            "SELECT importance FROM memory_nodes WHERE scope_path = %s AND properties ? 'dia_id'"
            " AND (properties ->> 'dia_id' = ANY(%s) OR properties -> 'dia_id' ?| %s)", (path, ev, ev)).fetchall()
        if found:
            why["ranked out (evidence node stored)"] += 1
            importance.append(max(f[0] for f in found))
            continue
        gone = con.execute(
            "SELECT a.reason FROM consolidation_archive a JOIN consolidation_runs r USING (run_id)"
            " WHERE r.scope_path = %s AND a.table_name = 'memory_nodes' AND a.op = 'delete'"
            " AND (a.row -> 'properties' ->> 'dia_id' = ANY(%s) OR a.row -> 'properties' -> 'dia_id' ?| %s) LIMIT 1",
            (path, ev, ev)).fetchone()
        why[f"evidence node deleted ({' '.join(str(gone[0]).split()[:3])})" if gone else "no evidence node (other hit kinds)"] += 1
    within = {}
    for b in BUDGETS:
        pairs = [(r, off.get((r["conversation"], r["qa_index"]))) for r in on_rows]
        within[f"lost_within_{b}"] = sum(1 for r, o in pairs if o and o.get(f"found@{b}") and not r.get(f"found@{b}"))
        within[f"gained_within_{b}"] = sum(1 for r, o in pairs if o and r.get(f"found@{b}") and not o.get(f"found@{b}"))
    return {**within, "lost_at_10": len(lost), "gained_at_10": gained, "lost_why": dict(sorted(why.items())),
            "lost_ranked_out_importance": {"min": min(importance), "max": max(importance),
                                           "mean": round(sum(importance) / len(importance), 3)} if importance else {}}


# ---------------------------------------------------------------------------------------------
# a mode end to end


def run_mode(store, convs: list[Conversation], mode: str, config, embedder, tenant: str, runs_dir: Path,
             qa_now: datetime, ids: SeededIds | None = None
             ) -> tuple[dict[str, Any], list[dict], dict[str, str]]:
    """One mode of :data:`MODES` end to end: every conversation replayed into a scope of its own, then QA."""
    from deep_sleep.core.scope import Scope

    naps, nights = MODES[mode]
    label = mode
    root = Scope.root("locomo", f"{tenant}-{mode}")
    times: dict[str, list[float]] = {k: [] for k in (
        "record_turn", "record_turn_without_nap", "record_turn_with_nap", "live_recall", "qa_recall", "night")}
    seconds = {"replay": 0.0, "nights": 0.0, "qa": 0.0}
    rows: list[dict] = []
    paths: dict[str, str] = {}
    nap_statuses: Counter = Counter()
    night_statuses: Counter = Counter()
    gate: Counter = Counter()
    rejected: list[str] = []
    nights_run = 0
    hit_kinds: Counter = Counter()
    covered_by: Counter = Counter()  # questions whose top 10 hold a hit of this kind citing their evidence
    with psycopg.connect(store.dsn) as con:
        replays: dict[str, Replay] = {}
        for conv in convs:
            scope = root.child("conversation", conv.sample_id)
            paths[conv.sample_id] = scope.path
            if ids is not None:
                ids.seed(scope.path)
            _p(f"{conv.sample_id} [{label}]: {len(conv.sessions)} sessions, "
               f"{sum(len(s.turns) for s in conv.sessions)} turns, {conv.facts} facts, {len(conv.questions)} questions")
            rep = replays[conv.sample_id] = replay(store, con, scope, conv, nights, config, embedder, runs_dir, naps)
            for k, v in rep.times.items():
                times[k] += v
            seconds["replay"] += rep.seconds["replay"]
            seconds["nights"] += rep.seconds["nights"]
            nap_statuses.update(rep.nap_statuses)
            night_statuses.update(rep.night_statuses)
            gate.update(rep.gate)
            rejected += rep.rejected
            nights_run += rep.nights
            _p(f"{conv.sample_id} [{label}]: replayed in {rep.seconds['replay']:.1f} s, {rep.nights} nights in "
               f"{rep.seconds['nights']:.1f} s, {sum(rep.nap_statuses.values())} quick naps")
        con.commit()
        at_end = rows_at_end(con, list(paths.values()))  # before QA, whose recalls add log rows
        con.commit()
        for conv in convs:
            scope = root.child("conversation", conv.sample_id)
            if ids is not None:
                ids.seed("qa " + scope.path)
            prov = provenance(con, scope.path, replays[conv.sample_id].event_dia)
            con.commit()
            t = time.perf_counter()
            qrows, qtimes = qa(con, scope, conv, prov, qa_now, embedder, config)
            seconds["qa"] += time.perf_counter() - t
            times["qa_recall"] += qtimes
            rows += qrows
            for r in qrows:
                hit_kinds.update(h["kind"] for h in r["hits"])
                covered_by.update({h["kind"] for h in r["hits"] if set(h["dia_ids"]) & set(r["evidence"])})
            s = summarize(qrows)["overall"]
            _p(f"{conv.sample_id} [{label}]: R@5 {s['r_at_5']:.3f}  R@10 {s['r_at_10']:.3f}")
        result = {
            "recall": summarize(rows),
            "per_conversation": {c.sample_id: summarize([r for r in rows if r["conversation"] == c.sample_id])["overall"]
                                 for c in convs},
            "coverage_digest": coverage_digest(rows),
            "rows_at_end": at_end,
            "ledger": ledger(con, list(paths.values()), config.gate.max_drop_pp),
            "nodes_deleted": deletions(con, list(paths.values())),
            "nights": nights_run,
            "night_statuses": dict(night_statuses),
            "gate": dict(sorted(gate.items())),
            "quick_naps": dict(nap_statuses),
            "rejected_ops": {"count": len(rejected), "first": rejected[:5]},
            "top10_hits_by_kind": dict(sorted(hit_kinds.items())),
            "questions_covered_at_10_by_hit_kind": dict(sorted(covered_by.items())),
            "wall_seconds": {k: round(v, 2) for k, v in seconds.items()},
            "latency_ms": {k: _pct(v) for k, v in times.items() if v},
        }
    return result, rows, paths


# ---------------------------------------------------------------------------------------------
# the command


def resolve_data(arg: str | None) -> Path:
    """``--data``, else ``$LOCOMO_DATA``, else ``../shared/data/locomo/locomo5_dev.json`` from the
    repository root (then from the working directory)."""
    candidates = [Path(arg)] if arg else [Path(p) for p in [os.environ.get("LOCOMO_DATA")] if p] + [
        ROOT / DEFAULT_DATA, Path.cwd() / DEFAULT_DATA]
    for c in candidates:
        if c.expanduser().is_file():
            return c.expanduser().resolve()
    raise SystemExit(f"LoCoMo data not found (looked at {', '.join(str(c) for c in candidates)}); "
                     f"the public file is {PUBLIC_SOURCE}: pass --data PATH")


def git_commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def _table(result: dict[str, Any]) -> str:
    modes = [m for m in MODES if m in result["modes"]]
    lines = ["", f"LoCoMo ({len(result['data']['conversations'])} conversations, "
                 f"{result['data']['questions']} questions; embedder {result['embedder']['name']})",
             "evidence found within the first 1,200 / 2,400 / 4,800 characters of the ranked hits (a passage read line by line),"
             " R@5, R@10, median characters of the top 10", ""]
    head = f"{'category':<16}" + "".join(f"{m:>46}" for m in modes)
    lines += [head, f"{'':<16}" + "".join(f"{'@1200 @2400 @4800  R@5  R@10  chars   n':>46}" for _ in modes)]
    cats = [("overall", None)] + [(f"{c} {CATEGORY_NAMES[c]}", str(c)) for c in CATEGORIES]
    for name, key in cats:
        line = f"{name:<16}"
        for m in modes:
            r = result["modes"][m]["recall"]
            f = r["overall"] if key is None else r["by_category"][key]
            cell = (f"{f['found_within_1200']:.3f} {f['found_within_2400']:.3f} {f['found_within_4800']:.3f} "
                    f"{f['r_at_5']:.3f} {f['r_at_10']:.3f} {f['median_chars_at_10']:>6} {f['questions']:>4}"
                    if f["questions"] else "-")
            line += f"{cell:>46}"
        lines.append(line)
    lines.append("")
    for m in modes:
        r = result["modes"][m]
        at = r["rows_at_end"]
        lat = r["latency_ms"]
        held = {mode: v.get("held_by_reason") for mode, v in r["ledger"].items()}
        gate = r.get("gate") or {}
        lines.append(f"{m}: nodes {at['memory_nodes']:,} {at['nodes_by_kind']} / edges {at['memory_edges']:,} / "
                     f"events {at['episodic_events']:,} / folded {at.get('episodic_folded', 0):,}; recall searches "
                     f"{at.get('rows_recall_searches_per_scope')} rows per scope; text chars {at.get('text_chars')}")
        lines.append(f"    held {held}; gate {gate}")
        lines.append("    p50/p95 ms: " + ", ".join(f"{k} {v['p50']}/{v['p95']}" for k, v in lat.items() if v.get("n")) +
                     f"; wall s {r['wall_seconds']}")
    if "comparison" in result:
        lines.append(f"nights vs none: {result['comparison']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help=f"LoCoMo JSON (default {DEFAULT_DATA} from the repository root; public: {PUBLIC_SOURCE})")
    ap.add_argument("--embedder", default=None,
                    help="the one embedder of the whole run (embedding.model): " + ", ".join(_embedder_names())
                         + ", or package.module:attribute; default: the configuration's")
    ap.add_argument("--modes", default="none,naps,nights",
                    help="comma-separated modes: none (no naps, no nights), naps (quick naps only), nights (naps + a "
                         "night after every session); default all three")
    ap.add_argument("--conversations", type=int, default=None, help="only the first N conversations of the file")
    ap.add_argument("--out", default="bench-results.json", help="results file; the 'locomo' key is replaced, others kept")
    ap.add_argument("--dsn", help="use this (migrated) database as is; default: a fresh database "
                                  f"{DATABASE!r} on the embedded server (or on $DEEP_SLEEP_BENCH_DSN's server)")
    ap.add_argument("--tenant", default="locomo", help="first id of the scopes (default locomo)")
    ap.add_argument("--config", help="a consolidation config TOML (default: defaults and DEEP_SLEEP_* variables)")
    ap.add_argument("--runs-dir", help="where the nights write snapshots and diffs (default: a temporary directory)")
    ap.add_argument("--random-ids", action="store_true",
                    help="let the live path draw random row ids, as in production (default: seeded per scope, so "
                         "two runs are identical; see SeededIds)")
    ap.add_argument("--hnsw", action="store_true",
                    help="keep the HNSW index on memory_nodes.embedding (approximate neighbours, as in production); "
                         "default: the benchmark's own database drops it, so recall's nearest neighbours are exact")
    ap.add_argument("--questions-out", help="write one JSON line per question and mode (hits, coverage)")
    args = ap.parse_args(argv)

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from deep_sleep.store.db import Store, create_database, embedded_dsn, migrate
    from deep_sleep.transforms.config import load_config

    data = resolve_data(args.data)
    convs = load_conversations(data, args.conversations)
    from deep_sleep.core.embedding import embedder_for

    config = load_config(args.config, {"embedding": {"model": args.embedder}} if args.embedder else None)
    embedder = embedder_for(config)  # one embedder everywhere: the turns, recall, the nights and their gate
    args.embedder = config.embedding.model
    if args.dsn:
        migrate(args.dsn)
        store = Store(args.dsn)
    else:
        admin = os.environ.get("DEEP_SLEEP_BENCH_DSN") or embedded_dsn(
            data_dir=os.path.join(".deep_sleep", "bench-pgdata"), database="postgres")
        store = create_database(admin, DATABASE)
        if not args.hnsw:
            with psycopg.connect(store.dsn, autocommit=True) as con:
                con.execute(f"DROP INDEX IF EXISTS {HNSW_INDEX}")
    with psycopg.connect(store.dsn) as con:
        nearest = "hnsw" if con.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", (HNSW_INDEX,)).fetchone() else "exact"
    last_end = max(s.end for c in convs for s in c.sessions)
    qa_now = next_night(last_end) + timedelta(hours=1)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: unknown mode(s) {unknown or args.modes!r}; choose among {', '.join(MODES)}")
    n_questions = sum(len(c.questions) for c in convs)
    _p(f"{data.name}: {len(convs)} conversations, {sum(len(s.turns) for c in convs for s in c.sessions)} turns, "
       f"{sum(c.facts for c in convs)} facts, {n_questions} questions (categories 1-4 with evidence); "
       f"embedder {args.embedder}; modes {'/'.join(modes)}")
    t_all = time.perf_counter()
    result: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": "python -m benchmarks.locomo " + " ".join(argv if argv is not None else sys.argv[1:]),
        "data": {"file": data.name, "sha256": hashlib.sha256(data.read_bytes()).hexdigest(), "source": PUBLIC_SOURCE,
                 "conversations": [c.sample_id for c in convs], "sessions": sum(len(c.sessions) for c in convs),
                 "turns": sum(len(s.turns) for c in convs for s in c.sessions), "facts": sum(c.facts for c in convs),
                 "questions": n_questions, "questions_skipped_no_evidence": sum(c.skipped_questions for c in convs),
                 "evidence_dropped": [e for c in convs for e in c.dropped_evidence]},
        "embedder": {"name": args.embedder, "model": getattr(embedder, "name", None), "dim": getattr(embedder, "dim", None)},
        "protocol": {"turn_gap_seconds": TURN_GAP.total_seconds(), "night_at_utc_hour": NIGHT_HOUR, "live_k": LIVE_K,
                     "qa_k": QA_K, "qa_now": qa_now.isoformat(), "budgets": list(BUDGETS),
                     "quick_nap_interval": config.quick_nap_interval, "seeded_ids": not args.random_ids,
                     "nearest_neighbours": nearest, "config": args.config},
        "modes": {},
    }
    all_rows: dict[str, list[dict]] = {}
    paths: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        runs_dir = Path(args.runs_dir) if args.runs_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="locomo-runs-")))
        ids = stack.enter_context(seeded_ids(not args.random_ids))
        for m in modes:
            t = time.perf_counter()
            result["modes"][m], all_rows[m], paths[m] = run_mode(store, convs, m, config, embedder, args.tenant,
                                                                 runs_dir, qa_now, ids)
            result["modes"][m]["wall_seconds"]["total"] = round(time.perf_counter() - t, 2)
    if "nights" in all_rows and "none" in all_rows:
        with psycopg.connect(store.dsn) as con:
            result["comparison"] = losses(con, all_rows["nights"], all_rows["none"], paths["nights"])
    result["wall_seconds_total"] = round(time.perf_counter() - t_all, 2)
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
                         "load_average_at_end": round(os.getloadavg()[0], 2)}
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc["locomo"] = result
    out.write_text(json.dumps(doc, indent=2) + "\n")
    if args.questions_out:
        with open(args.questions_out, "w") as fh:
            for m, rs in all_rows.items():
                for r in rs:
                    fh.write(json.dumps({"nights": m, **r}) + "\n")
    print(_table(result))
    _p(f"done in {result['wall_seconds_total']:.0f} s; written to {out} (key 'locomo')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
