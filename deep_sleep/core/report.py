"""The ``ConsolidationReport`` (SPEC §2 step 5, §8 ``report.json``).

The counter names are the phases' (each phase module declares its ``COUNTERS``): this layer cannot
know them, so a report for the roster is built one layer up (:func:`deep_sleep.transforms.new_report`,
or :meth:`ConsolidationReport.zeroed` with :data:`deep_sleep.transforms.COUNTERS`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from deep_sleep.core.errors import DiffError
from deep_sleep.core.files import write_atomic

_ATOMS = (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """A copy of ``value`` as ``dataclasses.asdict`` makes it (dicts, lists and tuples rebuilt,
    their items copied the same way, anything else deep-copied), with strings, numbers, booleans
    and None — nearly every value of a report — kept as they are (``deepcopy`` returns them anyway)."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    return asdict(_Box(value))["value"]  # tuples, nested dataclasses, datetimes…: exactly as asdict does


@dataclass(frozen=True)
class _Box:
    value: Any


@dataclass(frozen=True)
class ConsolidationReport:
    """What one run of one scope did (or, for a replay or a failed validation, would have done).

    scope_path, as_of: the run's scope and logical time (ISO 8601, UTC).
    counters: every counter of the roster (SPEC §3), summed over phases; a report built for the roster
        (:meth:`zeroed`) has each of them, 0 when nothing moved.
    counters_by_phase: phase → its non-zero counters.
    phases_run: phases that ran, in order, even if they found nothing.
    phases_skipped: phase → reason ("disabled by config", "missing input: …", "gated: …").
    timings: seconds per phase and per stage (extract, transform, validate, apply); within the
        transform stage also read_snapshot, quarantine, fold (folding each phase's diff into the
        next phase's view), combine, diff_hash and write_diff (the diff is written while it is hashed).
    rows_changed: table → {inserts, updates, deletes} of the diff; after apply, what landed.
    conflicts: updates/deletes skipped because a live writer changed the row after the snapshot.
    errors: human-readable errors (validation failures, exceptions); empty on success.
    notes: phase → things worth knowing that are not errors (e.g. rejected SOUL keys by name).
    validation: failing checks (check, table, phase, rows) when validation failed.
    quarantined: table → reason → rows set aside from the snapshot (left untouched in the store).
    llm: what the optional model summaries of phases 4 and 10 cost this run (SPEC §7): calls,
        input_tokens, output_tokens, cache_hits, model_summaries, fallbacks (and why: fallback_budget,
        fallback_error, fallback_malformed, fallback_cache_miss), retries; empty when the model is off.
    held: the rows held for approval (SPEC §9; ``<diff_uri>/held/``): ``rows`` (table → kind → rows),
        ``reasons`` (rule → rows), ``phases`` (phase → rows), ``why`` (one sentence per rule that fired),
        and ``status`` once decided; empty when nothing is held.  ``rows_changed`` and ``conflicts`` are
        then the applied part's.
    gate: the recall-quality gate's verdict (SPEC §9, :mod:`deep_sleep.run.gate`): ``status``
        (``measured``, or why not: ``no_used_query``, ``no_vectors``, ``zero_before``, ``disabled``,
        ``not_run``), ``detail`` and ``failed`` in every finished run's report; with replayed queries
        also ``queries``, ``recall_before`` and ``recall_after`` (recall@k of the used memories, 0–1)
        and ``drop_pp`` (percentage points).
    diff_hash: content hash of the diff (same snapshot + config + as_of → same hash).
    status: "planned" (replay), "applied", "failed", or "empty".
    run_id, snapshot_uri, diff_uri: where the run is recorded and stored.
    approval_of: for an approval's run (``mode = 'approve'``), the run whose held rows it applied.
    """

    scope_path: str
    as_of: str
    counters: dict[str, int] = field(default_factory=dict)
    counters_by_phase: dict[str, dict[str, int]] = field(default_factory=dict)
    phases_run: list[str] = field(default_factory=list)
    phases_skipped: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    rows_changed: dict[str, dict[str, int]] = field(default_factory=dict)
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)
    validation: list[dict[str, Any]] = field(default_factory=list)
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)
    llm: dict[str, int] = field(default_factory=dict)
    held: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    diff_hash: str = ""
    status: str = "planned"
    run_id: str | None = None
    snapshot_uri: str | None = None
    diff_uri: str | None = None
    approval_of: str | None = None

    @classmethod
    def zeroed(cls, counters: Iterable[str], **fields: Any) -> ConsolidationReport:
        """A report whose ``counters`` has each of ``counters`` at 0 (``fields`` as for the constructor)."""
        return cls(counters=dict.fromkeys(counters, 0), **fields)

    def with_(self, **changes: Any) -> ConsolidationReport:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready values (a fresh copy: changing it leaves the report as it
        is), without the sections only some runs carry (``llm``, ``held``, ``gate``) when they are
        empty.  Equal to :meth:`to_dict_plain` (``dataclasses.asdict``; tested): a nightly shard
        writes thousands of reports several times over, and ``asdict``'s recursion (a deepcopy of
        every counter) was a good part of a shard's transform stage."""
        return self._trimmed({f: _plain(getattr(self, f)) for f in self.__dataclass_fields__})

    def to_dict_plain(self) -> dict[str, Any]:
        """:meth:`to_dict` stated plainly, with ``dataclasses.asdict``."""
        return self._trimmed(asdict(self))

    @staticmethod
    def _trimmed(out: dict[str, Any]) -> dict[str, Any]:
        if not out["llm"]:  # only runs that used the model carry its costs: report.json stays as it was otherwise
            del out["llm"]
        if not out["held"]:  # likewise: only runs that held rows say so
            del out["held"]
        if not out["gate"]:  # likewise the gate's figures: only when it replayed a query
            del out["gate"]
        if out["approval_of"] is None:  # only an approval's run names the run it approved
            del out["approval_of"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str) + "\n"

    def write(self, directory: str | Path) -> Path:
        return write_atomic(Path(directory) / "report.json", self.to_json())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConsolidationReport:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def read(cls, directory: str | Path) -> ConsolidationReport:
        path = Path(directory) / "report.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DiffError(f"{path} does not exist: {directory} is not a planned diff directory; "
                            "run the plan stage (deep-sleep replay / the consolidate flow) first") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DiffError(f"{path} is not a readable report ({e}); plan the run again into a new directory") from None
        return cls.from_dict(data)
