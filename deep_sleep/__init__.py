"""Deep Sleep: offline memory consolidation for a multi-tenant agent-memory store.

One import namespace in layers; a module imports only from its own layer or a lower one
(``tests/test_layers.py`` fails on an upward import):

==========================  ==============================================================
``deep_sleep.core``         value objects and pure helpers: scope, tables, snapshot, diff,
                            canonical hash encoding, report, config, lookup, embedding, errors
``deep_sleep.store``        PostgreSQL: connections, migrations, the snapshot extract, node embeddings
``deep_sleep.transforms``   one pure function per phase and the ordered roster (``transforms/``)
``deep_sleep.validation``   pandera diff checks, snapshot quarantine, the store suite (``validation/``)
``deep_sleep.run``          the pipeline (stage values, one runner): transform, gate, holds, the apply
                            statements and their executor, run directories, the console
``deep_sleep.online``       the live path: turns, recall, the quick nap
``deep_sleep.jobs``         ledger, gating, a night's bookkeeping, approval, replay comparison, undo,
                            scope backfill, retention, run health
``deep_sleep.flows``        Prefect flows and deployments (``flows/``)
``deep_sleep.dev``          the synthetic store generator and loader (demo, tests, benchmarks)
``deep_sleep.cli``          the ``deep-sleep`` command
==========================  ==============================================================
"""

#: The layers, lowest first.  A module of layer i may import layers 0..i only.
LAYERS: tuple[str, ...] = ("core", "store", "transforms", "validation", "run", "online", "jobs", "flows",
                           "dev", "cli")

__all__ = ["LAYERS"]
