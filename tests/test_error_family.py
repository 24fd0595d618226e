"""Every exception raised on purpose is a ``DeepSleepError``: no bare built-in exception is raised
in the layers this test covers (a bare ``raise`` re-raising, or raising a caught error object, is
fine).  Read from the source, so a new ``raise ValueError(…)`` fails here before a user meets it."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COVERED = ["deep_sleep", "transforms", "flows", "validation"]  # the whole namespace
# AssertionError guards code that cannot be reached; it is a bug, never an answer to input.
BUILTIN_ERRORS = {name for name, obj in vars(builtins).items()
                  if isinstance(obj, type) and issubclass(obj, BaseException)} - {"AssertionError"}


def _files() -> list[Path]:
    out: list[Path] = []
    for entry in COVERED:
        path = ROOT / entry
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return out


def _protocol_raises(tree: ast.Module) -> set[int]:
    """Lines where Python's protocol asks for a built-in: a module's ``__getattr__`` (PEP 562) must
    raise AttributeError for a name it does not have, or ``hasattr`` and ``import *`` break."""
    return {node.lineno for fn in tree.body if isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__"
            for node in ast.walk(fn) if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
            and isinstance(node.exc.func, ast.Name) and node.exc.func.id == "AttributeError"}


def _bare_raises(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text(), str(path))
    allowed = _protocol_raises(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None and node.lineno not in allowed:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in BUILTIN_ERRORS:
                found.append(f"{path.name}:{node.lineno}: raise {target.id}")
    return found


def test_the_covered_files_exist():
    assert len(_files()) > 30


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bare_builtin_raise(path):
    assert _bare_raises(path) == []


def test_the_check_sees_a_bare_raise(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(e):\n    raise ValueError('x')\n\ndef g(e):\n    raise e\n\ndef h():\n    raise KeyError\n"
                     "\ndef __getattr__(name):\n    raise AttributeError(name)\n\ndef k():\n    raise AttributeError('x')\n")
    assert _bare_raises(probe) == ["probe.py:2: raise ValueError", "probe.py:8: raise KeyError", "probe.py:14: raise AttributeError"]
