"""Jobs over the store and the runs directory: ledger, gating, replay comparison (``compare``) and
date-range replay (``replay_range``), undo (``undo_plan`` → ``undo_sql`` → ``undo``), the scope
backfill (the ``backfill`` package).  May import every layer below flows."""
