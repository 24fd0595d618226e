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

#: The public entry points, importable from ``deep_sleep`` itself (loaded on first use, so that
#: ``import deep_sleep`` stays cheap):
#:
#:     >>> from deep_sleep import connect_store, consolidate, record_turn, recall   # doctest: +SKIP
#:     >>> store = connect_store(database="agents")          # the embedded server, or a DSN
#:     >>> state = consolidate(store, ["org/acme", "org/beta"], as_of="2026-11-20T03:00:00Z")
#:     >>> {path: report.status for path, report in state.reports.items()}
PUBLIC: dict[str, str] = {
    "consolidate": "deep_sleep.run.pipeline",        # a night for one scope or a shard: reports back
    "connect_store": "deep_sleep.store.db",          # a DSN, or a database on the embedded server
    "Store": "deep_sleep.store.db",
    "Scope": "deep_sleep.core.scope",
    "record_turn": "deep_sleep.online.turn",
    "recall": "deep_sleep.online.recall",
    "feedback": "deep_sleep.online.recall",
    "load_config": "deep_sleep.transforms.config",
    "ConsolidationConfig": "deep_sleep.transforms.config",
}

__all__ = ["LAYERS", "PUBLIC", *PUBLIC]


def __getattr__(name: str):
    if name in PUBLIC:
        import importlib

        return getattr(importlib.import_module(PUBLIC[name]), name)
    raise AttributeError(f"module 'deep_sleep' has no attribute {name!r}")
