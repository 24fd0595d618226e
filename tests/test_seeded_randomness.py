"""No code of ours draws from the global ``random`` module: tests seed their own ``random.Random``.

Hypothesis warns when the global random state moves while it generates an example ("Do not use the
`random` module inside strategies"), but the suite's Prefect test harness (started once per session)
keeps background threads -- service loops and event observers that jitter their sleeps with
``random.uniform`` -- that move that state at any moment, so that warning fires at random on
strategies that never touch it, and ``pyproject.toml`` filters it.  This scan keeps the guarantee
the warning gave: a call of a module-level ``random`` function (or a ``from random import``
of one) anywhere in the package or the tests fails here, naming the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["deep_sleep", "flows", "transforms", "validation", "tests", "benchmarks"]
#: what may be taken from ``random``: the seeded and the OS-entropy generator classes
ALLOWED = {"Random", "SystemRandom"}


def global_random_uses(source: str) -> list[tuple[int, str]]:
    """(line, ``random.<name>``) for every use of a module-level function of ``random`` in ``source``."""
    tree = ast.parse(source)
    names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names if a.name == "random"}
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names
                and node.attr not in ALLOWED):
            out.append((node.lineno, f"random.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "random":
            out += [(node.lineno, f"random.{a.name}") for a in node.names if a.name not in ALLOWED]
    return sorted(out)


def test_the_scan_finds_global_draws_and_passes_seeded_ones():
    assert global_random_uses("import random\nx = random.choice([1])\nr = random.Random(3)\n") == [(2, "random.choice")]
    assert global_random_uses("import random as R\nR.seed(1)\n") == [(2, "random.seed")]
    assert global_random_uses("from random import shuffle, Random\n") == [(1, "random.shuffle")]
    assert global_random_uses("import numpy as np\nnp.random.default_rng(1)\n") == []


def test_no_module_draws_from_the_global_random_state():
    files = [p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 100  # the walk really found the tree
    found = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in files
             for line, name in global_random_uses(p.read_text())]
    assert not found, ("draws from the global random state (seed a random.Random(…) instead):\n" + "\n".join(found))
