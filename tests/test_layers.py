"""The namespace's layering: every module of ``deep_sleep`` imports, and none imports upwards.

The layers are :data:`deep_sleep.LAYERS`, lowest first; a module of layer *i* may import layers
``0..i`` only (imports inside functions count too).  The user's top-level folders ``flows/``,
``transforms/`` and ``validation/`` are the subpackages ``deep_sleep.flows`` & co.: nothing imports
them under a top-level name, and the distribution installs only ``deep_sleep``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pkgutil
from pathlib import Path

import pytest

from deep_sleep import LAYERS

RANK = {name: i for i, name in enumerate(LAYERS)}


def _modules() -> list[str]:
    names = ["deep_sleep"] + [f"deep_sleep.{layer}" for layer in LAYERS]
    for layer in LAYERS:
        pkg = importlib.import_module(f"deep_sleep.{layer}")
        if hasattr(pkg, "__path__"):  # the mapped folders are not under deep_sleep/, so walk each layer
            names += [m.name for m in pkgutil.walk_packages(pkg.__path__, f"deep_sleep.{layer}.")]
    return sorted(set(names))


MODULES = _modules()


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "deep_sleep" or len(parts) < 2:
        return None
    return parts[1]


def _imports(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            if node.module == "deep_sleep":
                out += [(node.lineno, f"deep_sleep.{a.name}") for a in node.names]
    return sorted(out)


def test_every_layer_is_a_package_and_every_package_a_layer():
    packages = {m.split(".")[1] for m in MODULES if m.count(".") >= 1}
    assert packages == set(LAYERS), f"packages {sorted(packages)} vs layers {LAYERS}"
    assert len(MODULES) > 60  # the walk really found the tree


def test_the_walk_finds_the_run_layers_modules_and_the_single_scope_twins_are_gone():
    """The pipeline's modules (issue 29: one path) are checked like every other; ``deep_sleep.run.stages``
    (the single-scope entry points) is gone, its directory helpers in ``deep_sleep.run.layout``."""
    assert {"deep_sleep.run.layout", "deep_sleep.run.pipeline", "deep_sleep.run.transform", "deep_sleep.run.holds",
            "deep_sleep.run.apply", "deep_sleep.run.statements"} <= set(MODULES)
    assert "deep_sleep.run.stages" not in MODULES and importlib.util.find_spec("deep_sleep.run.stages") is None


def violations(module: str, source: str) -> list[str]:
    """Upward or top-level-folder imports in ``source``, the text of ``module``."""
    own = _layer(module)
    found = []
    for line, target in _imports(source):
        if target.split(".")[0] in {"flows", "transforms", "validation"}:
            found.append(f"{module}:{line} imports top-level {target!r}; import deep_sleep.{target} instead")
        other = _layer(target)
        if own is not None and other in RANK and RANK[other] > RANK[own]:
            found.append(f"{module}:{line} ({own}) imports {target} ({other})")
    return found


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_and_imports_no_higher_layer(module: str):
    importlib.import_module(module)
    spec = importlib.util.find_spec(module)
    found = violations(module, Path(spec.origin).read_text())
    assert not found, "\n".join(found)


def test_the_rule_catches_upward_and_top_level_imports():
    source = "import os\nfrom deep_sleep.core.scope import Scope\ndef f():\n    from deep_sleep.run.transform import transform\n" \
             "from deep_sleep import cli\nfrom transforms import ROSTER\n"
    found = violations("deep_sleep.core.probe", source)
    assert len(found) == 3, found
    assert "deep_sleep.run.transform" in found[0] and "deep_sleep.cli" in found[1] and "top-level" in found[2]
    assert violations("deep_sleep.cli", source) == [found[2].replace("deep_sleep.core.probe", "deep_sleep.cli")]


def test_distribution_installs_only_the_deep_sleep_namespace():
    dist = importlib.metadata.distribution("deep-sleep")
    top = (dist.read_text("top_level.txt") or "").split()
    assert top in ([], ["deep_sleep"]), top
    for name in ("flows", "transforms", "validation"):
        spec = importlib.util.find_spec(f"deep_sleep.{name}")
        assert spec is not None and Path(spec.origin).parent.name == name
