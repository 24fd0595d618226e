"""The report's fast ``to_dict`` is ``dataclasses.asdict`` (``to_dict_plain``): same values, same
types, and a fresh copy the report does not share."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from deep_sleep.core.report import ConsolidationReport

_atoms = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
                   st.datetimes(timezones=st.just(UTC)))
_values = st.recursive(_atoms, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=4)),
                       max_leaves=20)
_maps = st.dictionaries(st.text(max_size=6), _values, max_size=5)


def _same(a, b) -> bool:
    """Equal values of the same types, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@settings(max_examples=150, deadline=None)
@given(counters=st.dictionaries(st.text(max_size=6), st.integers(), max_size=6), notes=_maps, held=_maps, gate=_maps,
       llm=st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
       validation=st.lists(_maps, max_size=3), phases=st.lists(st.text(max_size=6), max_size=4),
       status=st.sampled_from(["planned", "applied", "failed"]), run_id=st.one_of(st.none(), st.text(max_size=8)))
def test_to_dict_is_asdict(counters, notes, held, gate, llm, validation, phases, status, run_id):
    r = ConsolidationReport(scope_path="org\x1facme", as_of="2026-11-30T03:00:00Z", counters=counters,
                            counters_by_phase={"strengthen": dict(counters)}, phases_run=phases, notes=notes,  # type: ignore[arg-type]
                            validation=validation, held=held, gate=gate, llm=llm, status=status, run_id=run_id,
                            timings={"extract": 0.5, "fold": 1e-6})
    fast, plain = r.to_dict(), r.to_dict_plain()
    assert _same(fast, plain)
    for key in ("counters", "notes", "validation", "phases_run"):  # a fresh copy, not the report's own
        assert fast[key] is not getattr(r, key)


def test_to_dict_copies_nested_values():
    r = ConsolidationReport(scope_path="org\x1facme", as_of="2026-11-30T03:00:00Z",
                            validation=[{"id": "a", "at": datetime(2026, 1, 1, tzinfo=UTC), "rows": (1, 2)}])
    out = r.to_dict()
    out["validation"][0]["id"] = "changed"
    assert r.validation[0]["id"] == "a"
    assert out["validation"][0]["rows"] == (1, 2) and "llm" not in out and "held" not in out and "gate" not in out
