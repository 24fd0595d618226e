"""Validation: pandera schemas over diffs (before apply), quarantine of bad snapshot rows, and the
great-expectations suite over the store (after apply)."""

from deep_sleep.validation.diff_checks import (
    FAILURE_SCHEMA,
    SNAPSHOT_COLUMNS,
    failed_scopes,
    validate_diff,
)

__all__ = ["FAILURE_SCHEMA", "SNAPSHOT_COLUMNS", "failed_scopes", "validate_diff"]
