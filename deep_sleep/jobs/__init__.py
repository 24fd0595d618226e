"""Jobs over the store and the runs directory: ledger, gating, replay comparison, undo, scope backfill.  May import every layer below flows."""
