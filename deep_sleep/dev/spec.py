"""What to generate: the :class:`SeedSpec`, the scopes it yields, and the vocabularies the rows draw from.

The vocabularies are plain lowercase words (none contains a risk marker at a word start), plus
the risk markers of phase 2 and their near misses, the edge relations, the actions of the
episodic events and the personas of the protected nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from deep_sleep.core.scope import Scope
from deep_sleep.dev.errors import SeedError

__all__ = ["SeedSpec", "nodes_in", "scopes_of", "tenant_name"]


# --------------------------------------------------------------------------------------------
# vocabularies (plain lowercase words: none contains a risk marker at a word start)

PREFIXES = (
    "project customer deploy incident preference meeting task bug feature release contact "
    "account invoice ticket policy team service database api config document note goal plan "
    "idea question decision event location product order payment vendor contract campaign "
    "report metric alert experiment model dataset pipeline schedule reminder travel health "
    "hobby family book recipe"
).split()

WORDS = (
    "alpha beta gamma delta billing checkout search onboarding mobile web backend frontend "
    "gateway cache queue worker cluster region europe asia america budget roadmap quarterly "
    "weekly monthly launch review sync standup retro hiring offsite training vendor partner "
    "pricing discount renewal upgrade migration rollout rollback hotfix patch schema index "
    "backup restore latency throughput uptime capacity storage network firewall login signup "
    "password reset email newsletter survey feedback support chat voice video coffee lunch "
    "dinner flight hotel train paris berlin tokyo london boston denver garden running yoga "
    "piano guitar chess novel poetry pasta curry salad bakery blue green orange purple "
    "morning evening friday monday summer winter spring autumn kitchen office remote hybrid "
    "laptop monitor keyboard printer router server ledger audit compliance privacy contract "
    "invoice refund shipping warehouse inventory supplier forecast dashboard report analytics"
).split()

# risk markers of phase 2 (with inflections that must match) and near misses that must not
MARKERS = (
    "risk risky danger dangerous failure failures loss losses negative decline declined "
    "warning warnings critical error errors threat threats Error CRITICAL Risk"
).split()
NEAR_MISSES = "terror asterisk brisket nonnegative".split()

RELATIONS = ("RELATED_TO", "CO_OCCURRED", "is", "lives_in", "works_at", "prefers", "CAUSES", "PART_OF")
RELATION_P = (0.33, 0.17, 0.09, 0.06, 0.08, 0.08, 0.08, 0.11)

# (past verb, object, action_type)
ACTIONS = (
    ("deployed", "billing service", "deploy_service"),
    ("ran", "migration", "run_migration"),
    ("restarted", "worker pool", "restart_workers"),
    ("reviewed", "pull request", "review_pull_request"),
    ("updated", "customer record", "update_customer_record"),
    ("scheduled", "follow-up meeting", "schedule_meeting"),
    ("rotated", "api keys", "rotate_keys"),
    ("backed up", "database", "backup_database"),
    ("sent", "invoice", "send_invoice"),
    ("closed", "support ticket", "close_ticket"),
)

TENANT_NAMES = "acme globex initech umbrella hooli stark wayne wonka tyrell cyberdyne".split()
BRANDS = "core labs retail cloud".split()
STYLES = ("support", "sales")
PERSONAS = ("Nova", "Atlas", "Iris", "Sage", "Echo", "Orion", "Luna", "Juniper")
ROLES = ("customer support agent", "sales assistant", "onboarding guide", "research assistant")
PERSONALITIES = ("warm and concise", "playful", "formal and precise", "curious and patient")
COLORS = ("teal", "amber", "crimson", "indigo")


# --------------------------------------------------------------------------------------------
# the spec


@dataclass(frozen=True)
class SeedSpec:
    """What to generate.  ``now`` None means the wall clock truncated to the second, read once
    when the spec is built (so :func:`generate` stays a pure function of the spec).

    embedding_model: a store as the live path writes it (:mod:`deep_sleep.dev.live`): every node,
        event and skill with this embedder's vector (``embedding.model``: ``hashing``, ``wordllama``,
        ``package.module:attribute``) and ``embedding_model``, and the recall log of the live recall
        with explicit feedback on a tenth of it.  None (the default): no vectors, a few random recall
        rows (what the benchmarks' diff hashes were measured on).
    embeddings: random unit vectors clustered by label prefix on nodes, events and skills (no model;
        ``embedding_model`` stays NULL), for tests and benchmarks that need vectors fast; not with
        ``embedding_model``."""

    tenants: int = 3
    scopes_per_tenant: int = 2
    nodes_per_scope: int = 200
    seed: int = 7
    now: datetime | None = None
    days: int = 90
    embeddings: bool = False
    legacy_rows: int = 0
    embedding_model: str | None = None

    def __post_init__(self) -> None:
        now = self.now
        if now is None:
            now = datetime.now(UTC).replace(microsecond=0)
        elif now.tzinfo is None or now.utcoffset() is None:
            raise SeedError(f"SeedSpec.now must be timezone-aware (UTC), got naive {now!r}")
        object.__setattr__(self, "now", now.astimezone(UTC))
        for name in ("tenants", "nodes_per_scope", "days"):
            if getattr(self, name) < 1:
                raise SeedError(f"SeedSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.embeddings and self.embedding_model is not None:
            raise SeedError(f"SeedSpec: embeddings (random vectors) and embedding_model={self.embedding_model!r} "
                            "exclude each other; pass one")
        for name in ("scopes_per_tenant", "legacy_rows"):
            if getattr(self, name) < 0:
                raise SeedError(f"SeedSpec.{name} must be >= 0, got {getattr(self, name)}")


def tenant_name(t: int) -> str:
    """The ``t``-th tenant's id: acme, globex, …, then acme1, globex1, …"""
    name = TENANT_NAMES[t % len(TENANT_NAMES)]
    return name if t < len(TENANT_NAMES) else f"{name}{t // len(TENANT_NAMES)}"


def _leaf(org: Scope, j: int) -> Scope:
    b = j // len(STYLES)
    brand = BRANDS[b % len(BRANDS)] + (str(b // len(BRANDS)) if b >= len(BRANDS) else "")
    return org.child("brand", brand).child("conversation", STYLES[j % len(STYLES)])


def scopes_of(spec: SeedSpec) -> list[Scope]:
    """Every scope that holds rows: per tenant the org scope, then its leaves."""
    out: list[Scope] = []
    for t in range(spec.tenants):
        org = Scope.root("org", tenant_name(t))
        out.append(org)
        out.extend(_leaf(org, j) for j in range(spec.scopes_per_tenant))
    return out


def nodes_in(spec: SeedSpec, scope: Scope) -> int:
    """Nodes the scope holds: an org scope with leaves holds a tenth (at least 30), a leaf all."""
    if scope.depth == 1 and spec.scopes_per_tenant > 0:
        return max(30, spec.nodes_per_scope // 10)
    return spec.nodes_per_scope
