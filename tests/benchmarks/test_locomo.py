"""benchmarks.locomo on a tiny LoCoMo-shaped conversation: exact coverage of questions designed to be
found and not found, the parsing of the dataset's odd values, provenance of every kind of hit, and
the documented keys of its output.  (No timing is asserted; the real data lives outside the
repository and is never read here.)"""

from __future__ import annotations

import doctest
import json
import uuid
from dataclasses import dataclass

import pytest

from benchmarks import locomo

BISCUIT = [
    "Biscuit the puppy chewed Ada's favourite sneakers.",
    "Biscuit the puppy loves the beach near Ada's house.",
    "Biscuit the puppy barks at the mail carrier every morning.",
    "Biscuit the puppy sleeps on Ada's bed.",
    "Biscuit the puppy dug up Ada's tulips in the garden.",
    "Biscuit the puppy plays fetch with a red ball.",
    "Biscuit the puppy goes to puppy school on Saturdays.",
    "Biscuit the puppy is afraid of the vacuum cleaner.",
    "Biscuit the puppy met a cat for the first time.",
    "Biscuit the puppy rode in Ada's car to the park.",
    "Biscuit the puppy got a new blue collar.",
    "Biscuit the puppy learned to swim in the lake.",
]


def _data() -> list[dict]:
    s2 = [{"speaker": "Ada", "dia_id": f"D2:{i + 1}", "text": f"Guess what Biscuit did: {fact[len('Biscuit the puppy '):]}"}
          for i, fact in enumerate(BISCUIT)]
    s2.append({"speaker": "Bo", "dia_id": "D2:13", "text": "The weather was lovely this weekend.",
               "img_url": ["http://example.invalid/x.jpg"], "blip_caption": "a photo of a sunny sky"})
    conversation = {
        "speaker_a": "Ada", "speaker_b": "Bo",
        "session_1_date_time": "10:00 am on 1 March, 2023",
        "session_1": [
            {"speaker": "Ada", "dia_id": "D1:1", "text": "Hi Bo! I just adopted a golden retriever puppy named Biscuit."},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Congrats! I started learning the cello last week."},
            {"speaker": "Ada", "dia_id": "D1:3", "text": "Nice. How is it going?"},
            {"speaker": "Bo", "dia_id": "D1:4", "text": "Slowly, my teacher is patient."},
        ],
        "session_2_date_time": "4:30 pm on 3 March, 2023",
        "session_2": s2,
        "session_3_date_time": "9:15 am on 10 March, 2023",
        "session_3": [
            {"speaker": "Bo", "dia_id": "D3:1", "text": "My sister Clara moved to Lisbon for a new job."},
            {"speaker": "Ada", "dia_id": "D3:2", "text": "Lisbon is beautiful. I visited Porto in 2019."},
            {"speaker": "Bo", "dia_id": "D3:3", "text": "See you soon!"},
        ],
    }
    observation = {
        "session_1_observation": {
            "Ada": [["Ada adopted a golden retriever puppy named Biscuit.", "D1:1"]],
            "Bo": [["Bo started learning the cello last week.", "D1:2"]],
        },
        "session_2_observation": {"Ada": [[fact, f"D2:{i + 1}"] for i, fact in enumerate(BISCUIT)]},
        "session_3_observation": {
            # a list of dia_ids, as the dataset sometimes gives
            "Bo": [["Bo's sister Clara moved to Lisbon for a new job.", ["D3:1"]]],
            "Ada": [["Ada visited Porto in 2019.", "D3:2"]],
        },
    }
    qa = [
        # 0: found — its evidence turn has an observation that matches the question
        {"question": "What is the name of Ada's golden retriever puppy?", "answer": "Biscuit", "evidence": ["D1:1"], "category": 4},
        # 1: found twice — D3:1 by its observation, D1:4 (which has none) by its own event: recall searches
        # episodic events too
        {"question": "Which city did Bo's sister Clara move to for her job?", "answer": "Lisbon",
         "evidence": ["D3:1; D1:4"], "category": 1},
        # 2: not found — the evidence turn has no observation and shares nothing with the question,
        # while twelve facts about Biscuit do
        {"question": "What tricks has Biscuit the puppy learned?", "answer": "?", "evidence": ["D1:4"], "category": 3},
        # 3: category 5 is not asked; 4: no usable evidence, not asked
        {"question": "What did Bo say about Biscuit's cello?", "adversarial_answer": "x", "evidence": ["D1:2"], "category": 5},
        {"question": "Where is Porto?", "answer": "Portugal", "evidence": ["D"], "category": 2},
    ]
    return [{"sample_id": "conv-t", "conversation": conversation, "observation": observation, "qa": qa}]


def test_doctests():
    assert doctest.testmod(locomo).failed == 0


def test_dataset_oddities():
    assert locomo.dia_ids(["D8:6; D9:17"]) == ["D8:6", "D9:17"]
    assert locomo.dia_ids("D:11:26") == ["D11:26"] and locomo.dia_ids(None) == [] and locomo.dia_ids(3) == []
    assert locomo.parse_when("7:55 pm on 9 June, 2023").isoformat() == "2023-06-09T19:55:00+00:00"
    assert locomo.parse_when("10:37  AM on 27 June, 2023").hour == 10
    with pytest.raises(ValueError):
        locomo.parse_when("sometime in June")
    t = locomo.parse_when("1:56 pm on 8 May, 2023")
    assert locomo.next_night(t).isoformat() == "2023-05-09T03:00:00+00:00"
    assert locomo.next_night(t.replace(hour=2)).isoformat() == "2023-05-08T03:00:00+00:00"


@dataclass(frozen=True)
class _FutureHit:
    """A hit as recall may return it later: its own id, a kind, source ids."""

    id: str
    kind: str
    label: str = ""
    source_ids: tuple[str, ...] = ()


def test_provenance_of_every_kind_of_hit():
    e1, e2, e3, s, o = (str(uuid.uuid4()) for _ in range(5))
    prov = locomo.Provenance({e1: "D1:1", e2: "D1:2", e3: None})
    prov.rows[o] = ("observation", ("D2:2",))
    prov.rows[s] = ("summary", prov.of_sources([e1, e3]))
    assert prov.of_hit(_FutureHit(o, "node")) == ("observation", ("D2:2",))
    assert prov.of_hit(_FutureHit(s, "summary")) == ("summary", ("D1:1",))
    assert prov.of_hit(_FutureHit(e2, "event")) == ("event", ("D1:2",))  # an archived event, known from the replay
    assert prov.of_hit(_FutureHit(str(uuid.uuid4()), "summary", source_ids=(e1, e2))) == ("summary", ("D1:1", "D1:2"))
    assert prov.of_hit(_FutureHit(str(uuid.uuid4()), "", label="META:ada")) == ("cluster", ())


def test_benchmark_on_a_tiny_conversation(store, tmp_path):
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(_data()))
    out = tmp_path / "bench-results.json"
    out.write_text(json.dumps({"online": {"kept": True}}))
    questions = tmp_path / "questions.jsonl"
    tenant = f"t{uuid.uuid4().hex[:8]}"
    assert locomo.main(["--data", str(data), "--dsn", store.dsn, "--tenant", tenant, "--modes", "none,naps,nights",
                        "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--questions-out", str(questions)]) == 0

    doc = json.loads(out.read_text())
    assert doc["online"] == {"kept": True}
    res = doc["locomo"]
    assert {"measured_at", "git_commit", "data", "embedder", "protocol", "modes", "comparison", "wall_seconds_total"} <= set(res)
    assert res["data"]["conversations"] == ["conv-t"]
    assert res["data"]["questions"] == 3 and res["data"]["questions_skipped_no_evidence"] == 1
    assert res["data"]["turns"] == 20 and res["data"]["facts"] == 16 and len(res["data"]["sha256"]) == 64
    assert res["embedder"]["name"] == "hashing" and res["embedder"]["dim"] == 256
    assert set(res["modes"]) == {"none", "naps", "nights"}

    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    for mode in ("none", "naps", "nights"):
        m = res["modes"][mode]
        assert {"recall", "per_conversation", "coverage_digest", "rows_at_end", "ledger", "nodes_deleted", "nights",
                "quick_naps", "top10_hits_by_kind", "wall_seconds", "latency_ms"} <= set(m)
        assert set(m["wall_seconds"]) == {"replay", "nights", "qa", "total"}
        assert {"record_turn", "live_recall", "qa_recall"} <= set(m["latency_ms"])
        assert {"p50", "p95"} <= set(m["latency_ms"]["qa_recall"])
        by_q = {r["qa_index"]: r for r in rows if r["nights"] == mode}
        assert sorted(by_q) == [0, 1, 2]
        got = {i: (r["covered@5"], r["covered@10"], r["share@5"], r["share@10"]) for i, r in by_q.items()}
        assert got == {0: (True, True, 1.0, 1.0), 1: (True, True, 1.0, 1.0), 2: (False, False, 0.0, 0.0)}, mode
        assert any(h["kind"] == "event" and h["dia_ids"] == ["D1:4"] for h in by_q[1]["hits"]), mode
        assert by_q[1]["evidence"] == ["D3:1", "D1:4"]
        overall = m["recall"]["overall"]
        assert (overall["questions"], overall["r_at_5"], overall["r_at_10"], overall["share_at_10"]) == (3, 0.6667, 0.6667, 0.6667)
        cats = m["recall"]["by_category"]
        assert set(cats) == {"1", "2", "3", "4"} and cats["2"]["questions"] == 0 and cats["4"]["r_at_10"] == 1.0
        assert m["rows_at_end"]["nodes_by_kind"]["observation"] == 16
        assert m["rows_at_end"]["episodic_events"] == 20  # a turn's own event, no filler beside it; no summary yet
        assert m["quick_naps"] == ({} if mode == "none" else {"applied": 2})
        # the reader's unit: evidence found within a budget of characters, and what the top 10 hand over
        assert {"found_within_1200", "found_within_2400", "found_within_4800", "median_chars_at_10"} <= set(overall)
        assert overall["found_within_1200"] == overall["found_within_4800"] == 0.6667
        at = m["rows_at_end"]  # one scope: what recall searches is its nodes and hot events
        assert at["rows_recall_searches_per_scope"] == at["memory_nodes"] + at["episodic_events"] >= 36
        assert set(m["rows_at_end"]["text_chars"]) >= {"events", "summaries", "archive_events"}
    assert res["modes"]["none"]["nights"] == res["modes"]["naps"]["nights"] == 0
    assert res["modes"]["nights"]["nights"] == 3 and res["modes"]["nights"]["ledger"]["nightly"]["runs"] == 3
    assert res["modes"]["nights"]["gate"]["status nothing_removed"] + res["modes"]["nights"]["gate"].get("status measured", 0) == 3
    assert res["comparison"]["lost_at_10"] == 0
