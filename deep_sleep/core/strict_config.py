"""Strict scalar knobs for the configuration models (issue 32), and the environment read as TOML.

A boolean, integer or number knob takes only a value of its own type as TOML (or JSON) writes it:
a string is not a number (``increment = "0.5"``), a boolean is not a number (``min_sessions =
true``), a number is not a boolean (``enabled = 1``), a fraction is not an integer (``3.0``),
``nan`` is not a number and a number must be finite (``1e400`` is ``inf`` in TOML); an integer is
a number, and must fit in 64 bits.  :class:`StrictScalars` checks a model's knobs and,
from there, every section nested in it (so a root model makes every section strict, whatever its
base class).  Other types — timestamps, strings, lists — are left to pydantic.

Environment variables are text: :class:`ScalarEnv` reads the text of a boolean / integer / number
knob as TOML writes that type (``true``/``false`` in any case, ``12``, ``0.75``, ``1e3``, ``inf``) and
leaves anything else for the strict check to refuse, naming the variable::

    >>> class Toy(StrictScalars):
    ...     share: float = 0.5
    >>> Toy(share=1).share, strictness_problems(Toy, {"share": "0.5"})
    (1.0, ["share: expected a number such as 0.5, got the string '0.5'; write it without quotes if you mean it"])
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from deep_sleep.core.errors import ConfigError

__all__ = ["ScalarEnv", "StrictScalars", "strictness_problems"]


class _EnvText:
    """An environment variable's text that is not a value of its knob's type (kept to name it)."""

    def __init__(self, variable: str, text: str):
        self.variable, self.text = variable, text


def _scalar_type(annotation: Any) -> type | None:
    """bool, int or float when a knob holds that scalar (or None), else None."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    kinds = [a for a in args if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (bool, int, float) else None


_WANTED = {bool: "true or false", int: "an integer such as 3", float: "a number such as 0.5"}


def _wrong(kind: type, value: Any) -> str | None:
    """Why ``value`` is not a ``kind`` as TOML writes one, or None."""
    if isinstance(value, _EnvText):
        return f"environment variable {value.variable}={value.text!r} is not {_WANTED[kind]} (write it as TOML would)"
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and not -2**63 <= value < 2**63:  # what every reader downstream (Polars, PostgreSQL) holds
            return (f"expected an integer within 64 bits (-2^63 … 2^63-1), got an integer of {len(str(abs(value)))} digits; "
                    "give a reasonable value")
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not (isinstance(value, float) and math.isnan(value))
        if ok and not math.isfinite(value):  # 1e400 in TOML is inf: a knob of hours or a share it would break
            return f"expected a finite number such as 0.5, got {value!r}"
    if ok:
        return None
    if isinstance(value, str):
        return f"expected {_WANTED[kind]}, got the string {value[:40]!r}; write it without quotes if you mean it"
    shown = str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, (int, float)) else f"a {type(value).__name__}"
    return f"expected {_WANTED[kind]}, got {shown}"


def strictness_problems(model: type[BaseModel], data: Any, where: str = "") -> list[str]:
    """Every knob of ``data`` (raw values for ``model``, sections included) whose value is not of its
    scalar type, as ``section.knob: why``; unknown knobs are left to pydantic (``extra="forbid"``)."""
    if not isinstance(data, Mapping):
        return []
    out = []
    for name, value in data.items():
        field = model.model_fields.get(name) if isinstance(name, str) else None
        if field is None or value is None:
            continue
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += strictness_problems(field.annotation, value, f"{where}{name}.")
            continue
        kind = _scalar_type(field.annotation)
        problem = _wrong(kind, value) if kind is not None else None
        if problem:
            out.append(f"{where}{name}: {problem}")
    return out


class StrictScalars(BaseModel):
    """A configuration model whose boolean, integer and number knobs take only values of their own
    type (see the module's docstring); sections nested in it are checked with it."""

    @model_validator(mode="before")
    @classmethod
    def _strict_scalars(cls, data: Any) -> Any:
        problems = strictness_problems(cls, data)
        if problems:
            raise ConfigError("; ".join(problems))
        return data


_INT = re.compile(r"[+-]?\d+(_\d+)*")
_FLOAT = re.compile(r"[+-]?(\d+(_\d+)*(\.\d+(_\d+)*)?([eE][+-]?\d+)?|inf)")


def _env_value(kind: type, variable: str, text: str) -> Any:
    """An environment variable's text as a value of ``kind``, read as TOML writes one; else an
    :class:`_EnvText` that the strict check names."""
    t = text.strip()
    if kind is bool and t.lower() in ("true", "false"):
        return t.lower() == "true"
    if kind in (int, float) and _INT.fullmatch(t):
        return int(t.replace("_", ""))
    if kind is float and _FLOAT.fullmatch(t.lower()):
        return float(t.lower().replace("_", ""))
    return _EnvText(variable, text)


def _env_values(model: type[BaseModel], values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out = {}
    for name, value in values.items():
        field = model.model_fields.get(name)
        variable = f"{prefix}{name.upper()}"
        if field is not None and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) \
                and isinstance(value, Mapping):
            value = _env_values(field.annotation, value, f"{variable}__")
        elif field is not None and isinstance(value, str) and _scalar_type(field.annotation) is not None:
            value = _env_value(_scalar_type(field.annotation), variable, value)
        out[name] = value
    return out


class ScalarEnv(PydanticBaseSettingsSource):
    """The environment source, with the text of each boolean / integer / number knob read as TOML."""

    def __init__(self, settings_cls: type[BaseSettings], env: PydanticBaseSettingsSource, prefix: str):
        super().__init__(settings_cls)
        self.env, self.prefix = env, prefix

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # unused: __call__ reads all
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return _env_values(self.settings_cls, self.env(), self.prefix)
