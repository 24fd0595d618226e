"""A phase owns its config: the configuration model is built from the roster, so a new phase's
section exists (TOML, environment, overrides) once its module and roster line do.

The toy phase (``tests/transforms/toy_phase.py``) is added to a roster by one line; nothing in
``deep_sleep.core.config`` knows it.  Its counters: ``test_roster.py``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deep_sleep.transforms import ROSTER, Phase
from deep_sleep.transforms.config import ConsolidationConfig, config_model, load_config

from deep_sleep.core.config import PhaseConfig, load
from deep_sleep.core.errors import ConfigError
from tests.transforms import toy_phase

TOY_ROSTER: tuple[Phase, ...] = (*ROSTER, Phase("T", toy_phase.toy, toy_phase.ToyConfig, toy_phase.COUNTERS))  # the line


def test_each_phase_section_is_the_config_its_module_declares():
    for phase in ROSTER:
        assert issubclass(phase.config, PhaseConfig) and phase.config.__module__ == phase.fn.__module__, phase.name
    assert ConsolidationConfig.phase_sections() == [p.name for p in ROSTER]
    for phase in ROSTER:
        assert type(ConsolidationConfig().phase(phase.name)) is phase.config


def test_every_default_of_spec_3_is_kept():
    assert ConsolidationConfig().model_dump() == {
        "lookback_hours": 24.0, "quick_nap_interval": 10,
        "gating": {"min_interval_hours": 24, "min_sessions": 20},
        "health": {"enabled": True, "idle_nights": 3, "max_conflict_rate": 0.2, "quarantine_jump_factor": 2.0,
                   "quarantine_jump_min": 10, "gated_factor": 2.0, "fail_nightly": True},
        "retention": {"keep_days": None, "force": False},
        "quarantine": {"max_label_chars": 2048, "min_timestamp": datetime(1990, 1, 1, tzinfo=UTC),
                       "future_tolerance_seconds": 300.0},
        "holds": {"enabled": True, "max_delete_share": 0.05, "max_deletes": 500, "soul_changes": True,
                  "drift_changes": False, "used_deletes": True},
        "llm": {"enabled": False, "api_key_env": "ANTHROPIC_API_KEY", "base_url": None, "model": "claude-haiku-4-5",
                "groups_per_request": 8, "max_output_tokens_per_group": 160, "max_summary_chars": 2000,
                "run_token_budget": 200000, "tenant_daily_token_budget": 2000000, "max_retries": 3,
                "backoff_seconds": 1.0, "max_backoff_seconds": 30.0, "timeout_seconds": 30.0},
        "gate": {"enabled": True, "k": 10, "max_queries": 50, "max_drop_pp": 2.0, "implicit": False, "probes": 8,
                 "probe_seed": 0, "probe_max_drop_pp": 10.0,
                 "probe_min_lost": 3.0},
        "embedding": {"model": "hashing"},
        "recall": {"lexical": True, "events": True, "fusion_k": 20.0, "lexical_weight": 2.0, "budget_chars": 2400,
                   "max_passage_chars": 600},
        "strengthen": {"enabled": True, "min_accesses": 2, "increment": 0.5, "cap": 10.0},
        "cooccurrence": {"enabled": True, "window_seconds": 900.0, "max_neighbours": 5},
        "tag_risk": {"enabled": True, "markers": ("risk", "danger", "failure", "loss", "negative", "decline", "warning",
                                                  "critical", "error", "threat")},
        "pending_edges": {"enabled": True},
        "supersession": {"enabled": True, "functional_relations": ("is", "lives_in", "works_at", "prefers", "role")},
        "prune_orphans": {"enabled": True, "importance_factor": 0.4, "min_age_days": 7, "max_degree": 1,
                          "keep_labels": ("META:episodic_summary",)},
        "meta_nodes": {"enabled": True, "min_group": 3, "max_members": 10},
        "soul_corrections": {"enabled": True, "canonical_keys": ("name", "role", "personality", "language")},
        "working_ttl": {"enabled": True},
        "decay_importance": {"enabled": True, "stale_days": 30, "step": 0.5, "floor": 1.0, "min_interval_hours": 24,
                             "exempt_importance": 8.0},
        "episodic_summary": {"enabled": True, "threshold": 100, "batch_size": 50, "max_batches": 1, "max_chars": 1000,
                             "max_keywords": 1000},
        "synthetic_links": {"enabled": True, "lookback_days": 7, "min_cooccurrences": 2, "weight": 0.1,
                            "max_sources": 20, "max_pairs": 50},
        "procedural_promotion": {"enabled": True, "lookback_days": 30, "min_occurrences": 3, "max_per_run": 5,
                                 "duplicate_cosine": 0.65},
        "label_recalls": {"enabled": True, "min_label": 0.5},
        "train_reranker": {"enabled": True, "learning_rate": 0.05, "explicit_weight": 2.0},
        "drift": {"enabled": True, "max_step": 0.05},
    }


def test_a_new_phase_gets_its_config_section_from_toml_env_and_overrides(tmp_path, monkeypatch):
    Model = config_model(TOY_ROSTER)
    assert Model.phase_sections() == [p.name for p in TOY_ROSTER]
    assert Model().phase("toy") == toy_phase.ToyConfig() and Model().toy.depth == 3
    assert Model().strengthen == ConsolidationConfig().strengthen  # the other sections are the roster's

    toml = tmp_path / "deep-sleep.toml"
    toml.write_text("lookback_hours = 12\n\n[toy]\ndepth = 4\nwidth = 1.5\nenabled = false\n")
    monkeypatch.setenv("DEEP_SLEEP_TOY__WIDTH", "7.25")
    got = load(Model, toml)
    assert (got.lookback_hours, got.toy.depth, got.toy.width, got.toy.enabled) == (12, 4, 7.25, False)  # env > TOML
    got = load(Model, toml, overrides={"toy": {"depth": 9, "width": 0.25}})
    assert (got.toy.depth, got.toy.width, got.toy.enabled) == (9, 0.25, False)  # overrides > env > TOML

    with pytest.raises(ConfigError, match=r"toy\.depth: Input should be greater than or equal to 1"):
        load(Model, overrides={"toy": {"depth": 0}})
    with pytest.raises(ConfigError, match=r"toy\.colour: Extra inputs are not permitted"):
        load(Model, overrides={"toy": {"colour": "red"}})
    # the roster's configuration does not know the toy phase: its section is refused there
    with pytest.raises(ConfigError, match=r"\(from .*deep-sleep\.toml\): toy: Extra inputs are not permitted"):
        load_config(toml)


def test_a_phase_name_twice_is_refused():
    twice = Phase("T", toy_phase.toy, toy_phase.ToyConfig, toy_phase.COUNTERS)
    with pytest.raises(ConfigError, match="toy appear more than once"):
        config_model((*ROSTER, twice, twice))


def test_env_reaches_the_roster_configuration(monkeypatch):
    monkeypatch.setenv("DEEP_SLEEP_STRENGTHEN__INCREMENT", "0.75")
    monkeypatch.setenv("DEEP_SLEEP_GATING__MIN_SESSIONS", "3")
    got = load_config(overrides={"strengthen": {"cap": 5.0}})
    assert (got.strengthen.increment, got.strengthen.cap, got.gating.min_sessions) == (0.75, 5.0, 3)


def _documented_table() -> dict[str, str]:
    """The configuration table of docs/configuration.md: section → the text of its knobs cell."""
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    table = text[text.index("| section | knobs (defaults) |"):].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        sections, knobs = (cell.strip() for cell in line.strip("|").split("|"))
        for section in re.findall(r"`(\w+)`", sections) or [sections]:
            rows[section] = knobs
    return rows


def test_the_documented_configuration_table_lists_every_section_knob_and_default():
    rows = _documented_table()
    defaults = ConsolidationConfig().model_dump()
    top = {k: v for k, v in defaults.items() if not isinstance(v, dict)}
    sections = {"top level": top, **{k: v for k, v in defaults.items() if isinstance(v, dict)}}
    assert set(rows) == set(sections)
    for section, knobs in sections.items():
        for knob, value in knobs.items():
            if knob == "enabled":
                continue
            found = re.search(rf"`{knob}` ([^,`(]+(?:, [a-z_]+)*)", rows[section])
            assert found, f"docs/configuration.md's table does not list {section}.{knob}"
            shown = found.group(1).strip()
            expected = ((", ".join(value) or "none") if isinstance(value, tuple) else str(value).lower()
                        if isinstance(value, bool) or value is None else value.isoformat()
                        if isinstance(value, datetime) else value)
            assert (shown == expected) if isinstance(expected, str) else (float(shown) == expected), (section, knob, shown)
