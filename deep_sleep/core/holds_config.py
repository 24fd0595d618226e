"""The ``holds`` section of the configuration: which rows of a run wait for approval (SPEC §9, issue 16).

A held row is not applied with the rest of the diff; it is kept with the run (``<diff>/held/``, the
report, the ledger) until ``deep-sleep approve`` applies it through the same version guard or
``deep-sleep reject`` discards it.  The rules (:func:`deep_sleep.run.holds.split_holds`):

- ``max_delete_share`` / ``max_deletes``: when the run would delete more than this share of the
  scope's semantic nodes, or more than this many, every semantic-node delete is held;
- ``soul_changes``: every ``soul_profiles`` change a SOUL correction (phase 5) makes — an edit of
  the agent's identity that a user asked for, which an operator confirms;
- ``drift_changes``: every ``soul_profiles`` change identity drift (phase D4) makes.  Off by default
  (SPEC §9 as amended 2026-12-04): drift moves each trait by a bounded step (≤ 0.05) every night in
  every scope, so holding it filled the queue with hundreds of routine rows a night that nobody
  could review;
- ``used_deletes``: the delete of any node with explicit positive recall feedback (a
  ``recall_events`` row for it with ``label_source = 'explicit'`` and ``label = 1.0``).

``enabled = false`` turns the policy off (a failed recall-quality gate still holds).

    >>> HoldsConfig().max_delete_share, HoldsConfig().max_deletes
    (0.05, 500)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HoldsConfig(BaseModel):
    """enabled: apply the policy at all.
    max_delete_share: hold the semantic-node deletes when they are more than this share of the scope's semantic nodes.
    max_deletes: … or more than this many.
    soul_changes: hold the SOUL corrections' ``soul_profiles`` changes (phase 5).
    drift_changes: hold identity drift's ``soul_profiles`` steps (phase D4); off by default.
    used_deletes: hold the delete of a node the agent used (explicit positive recall feedback).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    max_delete_share: float = Field(0.05, ge=0, le=1)
    max_deletes: int = Field(500, ge=0)
    soul_changes: bool = True
    drift_changes: bool = False
    used_deletes: bool = True
