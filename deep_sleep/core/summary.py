"""Summaries for phases 4 and 10: what a phase asks a summarizer, and what it gets back.

A phase that writes summary text (``meta_nodes``, ``episodic_summary``) takes a ``summarizer``
argument from the runner, the way phase 12 takes an ``embedder``.  It builds the deterministic
text first, then hands the summarizer one :class:`SummaryRequest` per group and uses each
:class:`Summary` it gets back; ``None`` means "keep the deterministic text" (the fallback).  The
phase itself stays pure: everything with side effects — the model client, the cache, the token
budget — lives in the object passed in (:mod:`deep_sleep.run.llm`), above the transforms.

    >>> r = SummaryRequest("meta_nodes", "tenant\\x1facme", "project", ("project: a", "project: b"), "project (2): …")
    >>> DETERMINISTIC.summarize([r])
    [None]

A summary that came from a model carries the model's name; the phase writes it into the node's
``properties.summary_model`` so the diff records which summaries are the model's.  Deterministic
summaries carry no such key, so a run with the model off (or every call fallen back) gives the
very diff — and hash — of a run without this feature.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["DETERMINISTIC", "DeterministicSummarizer", "Summarizer", "Summary", "SummaryRequest"]


@dataclass(frozen=True)
class SummaryRequest:
    """One group to summarise.

    kind: the phase asking (``"meta_nodes"`` or ``"episodic_summary"``).
    scope_path: the scope the group belongs to (its tenant bounds the token budget).
    key: the group's natural key within the phase (the label prefix; the batch's first|last ids).
    items: the texts to summarise, in the phase's order (member labels; event contents).
    fallback: the deterministic summary the phase writes when no model summary comes back.
    """

    kind: str
    scope_path: str
    key: str
    items: tuple[str, ...]
    fallback: str

    def content_hash(self, model: str, prompt_version: str) -> str:
        """SHA-256 of what decides the answer: model, prompt version, kind and items (not the key or scope)."""
        body = json.dumps([model, prompt_version, self.kind, list(self.items)], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Summary:
    """A model's summary: the text and the model that wrote it."""

    text: str
    model: str


@runtime_checkable
class Summarizer(Protocol):
    """Anything that answers requests in order: a :class:`Summary`, or ``None`` for the fallback."""

    def summarize(self, requests: Sequence[SummaryRequest]) -> list[Summary | None]: ...


class DeterministicSummarizer:
    """Never summarises: every request keeps its deterministic text (the default)."""

    def summarize(self, requests: Sequence[SummaryRequest]) -> list[Summary | None]:
        return [None] * len(requests)


DETERMINISTIC = DeterministicSummarizer()
