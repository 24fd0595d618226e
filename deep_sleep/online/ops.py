"""A turn's operations as pydantic models — one per op, a discriminated union on ``op`` — and the
redaction of credentials in them (SPEC §5).

==================  =====================================================  ======================
op                  fields (``?`` optional)                                 lands in
==================  =====================================================  ======================
``upsert_node``     label, properties?, importance? (1–10), layer?          memory_nodes (semantic;
                    (``semantic`` default, or ``working``)                  by label in the exact
                                                                            scope: update, else insert)
``create_event``    content, metadata?, session_id?                         episodic_events
``set_trigger``     condition, action, due_at? (ISO 8601)                   prospective_triggers
``register_skill``  name, description?, steps? (list); status is ignored    procedural_skills, always
                                                                            ``draft`` (same name in
                                                                            the scope: not re-filed)
``thinking``        text                                                    memory_nodes, working,
                                                                            ``ttl_hours`` = 24
``read_node``       id (a node visible from the scope)                      memory_access_log only
==================  =====================================================  ======================

Any op may name its ``layer``; one of the five layers that does not fit the op is rejected.
Limits (a reason names the one broken): :data:`MAX_OPS_PER_TURN` operations per turn;
:data:`MAX_OP_BYTES` bytes of JSON per operation; labels and names :data:`MAX_LABEL_CHARS`
characters (fewer if the ``quarantine`` section's ``max_label_chars`` says so), at most
:data:`MAX_INDEXED_BYTES` bytes of UTF-8 together with the scope path (PostgreSQL indexes a label
and a skill name with it), with no control characters, none of the invisible or
direction-changing characters of :data:`~deep_sleep.core.characters.INVISIBLE` (U+200B, U+2028,
U+202E, U+00AD, U+061C, tag characters U+E0000–E007F, U+3164, U+2800…), no presentation selector
U+FE0E/FE0F but right after a symbol or a keycap base (``❤️`` is fine, ``hello\ufe0f`` is not), and
no combining mark at the start (a label of marks alone) — refused, never stripped: the stored label
is what the agent sent or nothing (the night would quarantine such a row, every night; the reason
shows the code points, :data:`~deep_sleep.core.characters.HIDDEN`);
texts :data:`MAX_TEXT_CHARS` characters; JSON nesting :data:`MAX_DEPTH` levels; no NUL characters or
lone surrogates anywhere (PostgreSQL cannot store them); numbers finite, integers within 64 bits
(:data:`MAX_INT`; larger ones do not survive the night's JSON readers — send them as strings);
``due_at`` a time that exists in UTC (``9999-12-31T23:59:59-12:00`` is past the end of the
calendar).  Nothing a check lets through can fail the write: an op is rejected here, by name, or it
lands.  Unknown extra fields are ignored.

The models check with our own plain validators, not pydantic's coercion: JSON's types, not
Python's (``True`` is not a number; ``"5"`` is not one either), and every reason is ours, naming
the field and the rule.  An op's checks run in a fixed order — the op's name, its size, its
layer, then its fields in declaration order — and the first that fails is the reason.

Before anything is stored, every property / metadata / step key that looks like a credential
(:func:`~deep_sleep.online.credentials.is_credential_key`: ``password``, ``db_pass``, ``sshKey``,
``p@ssw0rd``, ``пароль``, ``mot_de_passe``…, at any depth) gets the value ``"[REDACTED]"``, and in
every string the op stores (values, texts, labels) secrets of well-known formats are replaced by it
(:func:`~deep_sleep.online.credentials.redact_text`: ``postgres://app:[REDACTED]@db``, ``AKIA…``,
JWTs, PEM private keys, ``sk-…``, ``ghp_…``).  The rules, and what they over-redact on purpose
(``max_tokens`` too), are in :mod:`deep_sleep.online.credentials`.

    >>> op, redacted = check_op(0, {"op": "upsert_node", "label": "user: Ada", "properties": {"api_key": "sk-1"}})
    >>> op.label, op.layer, op.properties, redacted
    ('user: Ada', 'semantic', {'api_key': '[REDACTED]'}, ('ops[0].properties.api_key',))
    >>> check_op(1, {"op": "thinking", "text": " "})
    Traceback (most recent call last):
    ...
    deep_sleep.online.errors.OpRejected: field 'text' is blank
"""

from __future__ import annotations

import json
import math
import re
import uuid
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from deep_sleep.core.characters import hidden
from deep_sleep.core.snapshot import utc
from deep_sleep.online.credentials import REDACTED, is_credential_key, redact_text
from deep_sleep.online.errors import OpRejected

__all__ = [
    "LAYERS", "MAX_DEPTH", "MAX_INDEXED_BYTES", "MAX_INT", "MAX_LABEL_CHARS", "MAX_OPS_PER_TURN", "MAX_OP_BYTES", "MAX_TEXT_CHARS", "OPS",
    "REDACTED",
    "CreateEvent", "Op", "ReadNode", "RegisterSkill", "SetTrigger", "Thinking", "UpsertNode",
    "check_label", "check_op", "check_text", "is_credential_key", "op_name", "redact",
]

MAX_OPS_PER_TURN = 256
MAX_OP_BYTES = 64 * 1024
MAX_LABEL_CHARS = 512
MAX_TEXT_CHARS = 16_000
MAX_DEPTH = 16
MAX_INT = 2**63 - 1  # integers in [-2**63, 2**63 - 1]: what DuckDB's and Polars' JSON readers take as BIGINT / Int64
#: PostgreSQL's btree index rows hold at most 2704 bytes, and nodes are indexed on (scope_path, label), skills on
#: (scope_path, lower(name)): a label's UTF-8 bytes and its scope path's must fit together in this (less the row headers).
MAX_INDEXED_BYTES = 2600
LAYERS = ("semantic", "working", "episodic", "procedural", "prospective")

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


# ---------------------------------------------------------------------------------------------
# JSON values: storable, credentials redacted


def _number(value: int | float) -> str:
    """A number for a message: an integer too long to print (Python will not print one of more than
    4300 digits) is described by its length."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return repr(value)


def _scrubbed(value: str, path: str, redacted: list[str]) -> str:
    """``value`` with its well-known secrets replaced (the path is appended to ``redacted`` if any)."""
    clean, n = redact_text(value)
    if n:
        redacted.append(path)
    return clean


def _storable(value: str, where: str) -> str:
    if "\x00" in value:
        raise OpRejected(f"{where} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise OpRejected(f"{where} is not valid Unicode (it holds a lone surrogate)") from None
    return value


def redact(value: Any, path: str, redacted: list[str], depth: int = 0) -> Any:
    """``value`` with every credential-looking key's value replaced by ``"[REDACTED]"``, and secrets of
    well-known formats in its strings too (paths appended to ``redacted``); raises
    :class:`OpRejected` on what cannot be stored as JSON (the reason names the path)."""
    if depth > MAX_DEPTH:
        raise OpRejected(f"{path} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise OpRejected(f"{path}: keys must be strings, got {type(k).__name__} {k!r}")
            _storable(k, f"{path} key {k[:40]!r}")
            if is_credential_key(k):
                out[k] = REDACTED
                redacted.append(f"{path}.{k}")
            else:
                out[k] = redact(v, f"{path}.{k}", redacted, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [redact(v, f"{path}[{i}]", redacted, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, str):
        return _scrubbed(_storable(value, path), path, redacted)
    if isinstance(value, float) and not math.isfinite(value):
        raise OpRejected(f"{path} is {value}; numbers must be finite")
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT - 1 <= value <= MAX_INT:
        raise OpRejected(f"{path} is {_number(value)}; integers must fit in 64 bits "
                         f"(-2^63 … 2^63-1): send a larger one as a string")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise OpRejected(f"{path}: a {type(value).__name__} is not a JSON value")


# ---------------------------------------------------------------------------------------------
# field checks (plain validators: each gets the raw value, None when the field is absent)


def _typed(value: Any, name: str, kinds: type | tuple[type, ...], what: str, required: bool) -> Any:
    if value is None:
        if required:
            raise OpRejected(f"field {name!r} is missing ({what} required)")
        return None
    if not isinstance(value, kinds) or isinstance(value, bool):  # True is an int to Python, not to JSON
        raise OpRejected(f"field {name!r} must be {what}, got {type(value).__name__}")
    return value


def check_label(value: Any, name: str, max_chars: int = MAX_LABEL_CHARS, max_bytes: int | None = None) -> str:
    """A label or name: a non-blank string of at most ``max_chars`` characters (and ``max_bytes`` bytes
    of UTF-8, also lower-cased, if given) without control characters or invisible /
    direction-changing ones; raises :class:`OpRejected` naming ``name`` and the rule broken.

    >>> check_label("user:\u202eAda", "label")
    Traceback (most recent call last):
    ...
    deep_sleep.online.errors.OpRejected: field 'label' contains invisible or direction-changing character(s) U+202E RIGHT-TO-LEFT OVERRIDE at position 5; a label must read as what it holds (the nightly run quarantines such rows): remove them
    """
    value = _typed(value, name, str, "a string", True)
    if not value.strip():
        raise OpRejected(f"field {name!r} is blank")
    if len(value) > max_chars:
        raise OpRejected(f"field {name!r} has {len(value)} characters; the limit is {max_chars}")
    bad = CONTROL.search(value)
    if bad:
        raise OpRejected(f"field {name!r} contains control character {bad.group()!r} at position {bad.start()}")
    problem = hidden(value)
    if problem:
        raise OpRejected(f"field {name!r} {problem}; a label must read as what it holds (the nightly run quarantines "
                         "such rows): remove them")
    value = _storable(value, f"field {name!r}")
    if max_bytes is not None:
        size = max(len(value.encode()), len(value.lower().encode()))
        if size > max_bytes:
            raise OpRejected(f"field {name!r} is {size} bytes of UTF-8; with the scope path it must fit in "
                             f"{MAX_INDEXED_BYTES} bytes (PostgreSQL indexes them together), which leaves {max_bytes} here")
    return value


def _check_label_field(value: Any, info: ValidationInfo, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    ctx = info.context or {}
    indexed = ctx.get("max_label_bytes") if info.field_name in ("label", "name") else None
    value = check_label(value, info.field_name, ctx.get("max_label_chars", MAX_LABEL_CHARS), indexed)
    return _scrubbed(value, f"ops[{ctx.get('index', '?')}].{info.field_name}", ctx.get("redacted", []))


def check_text(value: Any, name: str, required: bool = True) -> str | None:
    """A text: a string (non-blank if ``required``) of at most :data:`MAX_TEXT_CHARS` characters that
    PostgreSQL can store; raises :class:`OpRejected` naming ``name`` and the rule broken."""
    value = _typed(value, name, str, "a string", required)
    if value is None:
        return None
    if required and not value.strip():
        raise OpRejected(f"field {name!r} is blank")
    if len(value) > MAX_TEXT_CHARS:
        raise OpRejected(f"field {name!r} has {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
    return _storable(value, f"field {name!r}")


def _check_text(value: Any, info: ValidationInfo, required: bool) -> str | None:
    value = check_text(value, info.field_name, required)
    if value is None:
        return None
    ctx = info.context or {}
    return _scrubbed(value, f"ops[{ctx.get('index', '?')}].{info.field_name}", ctx.get("redacted", []))


def _check_json(kind: type) -> PlainValidator:
    what = "a JSON object" if kind is dict else "a list"

    def check(value: Any, info: ValidationInfo) -> Any:
        value = _typed(value, info.field_name, kind, what, False)
        ctx = info.context or {}  # check_op passes the op's index and the list of redacted paths
        path = f"ops[{ctx.get('index', '?')}].{info.field_name}"
        return redact(value if value is not None else kind(), path, ctx.get("redacted", []))

    return PlainValidator(check)


def _check_importance(value: Any, info: ValidationInfo) -> float | None:
    value = _typed(value, info.field_name, (int, float), "a number in [1, 10]", False)
    if value is not None and not 1.0 <= value <= 10.0:  # NaN compares false; an int too big for a float compares fine
        raise OpRejected(f"field 'importance' is {_number(value)}; it must be within [1, 10]")
    return None if value is None else float(value)


def _check_due_at(value: Any, info: ValidationInfo) -> datetime | None:
    value = _typed(value, info.field_name, str, "an ISO 8601 timestamp", False)
    try:
        return utc(value) if value is not None else None
    except OverflowError:  # 9999-12-31T23:59:59-12:00 is year 10000 in UTC; 0001-01-01T00:00:00+01:00 is year 0
        raise OpRejected(f"field 'due_at' is {value[:40]!r}, which is outside years 1–9999 once converted to UTC") from None
    except ValueError:
        raise OpRejected(f"field 'due_at' is {value[:40]!r}, not an ISO 8601 timestamp") from None


def _check_node_id(value: Any, info: ValidationInfo) -> str:
    value = _typed(value, info.field_name, str, "a node id (UUID)", True)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise OpRejected(f"field 'id' is {value[:40]!r}, not a UUID") from None


Label = Annotated[str, PlainValidator(_check_label_field)]
OptionalLabel = Annotated[str | None, PlainValidator(lambda v, info: _check_label_field(v, info, required=False))]
Text = Annotated[str, PlainValidator(lambda v, info: _check_text(v, info, True))]
OptionalText = Annotated[str, PlainValidator(lambda v, info: _check_text(v, info, False) or "")]
JsonObject = Annotated[dict[str, Any], _check_json(dict)]
JsonList = Annotated[list[Any], _check_json(list)]
Importance = Annotated[float | None, PlainValidator(_check_importance)]
Timestamp = Annotated[datetime | None, PlainValidator(_check_due_at)]
NodeId = Annotated[str, PlainValidator(_check_node_id)]


# ---------------------------------------------------------------------------------------------
# the operations


class _Op(BaseModel):
    """What every op shares: a size limit and a ``layer`` (checked first, in that order).  After
    checking, ``layer`` is the layer the op writes (the one it named, else its first).

    Every field defaults to None and defaults are validated, so an absent field reaches its
    validator too, which rejects it by name when it is required (``field 'label' is missing``);
    a checked op holds no None in a required field."""

    model_config = ConfigDict(frozen=True, extra="ignore", validate_default=True)
    WRITES: ClassVar[tuple[str, ...]]

    layer: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _size(cls, data: Any) -> Any:
        try:
            size = len(json.dumps(data, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass"))
        except RecursionError:
            raise OpRejected(f"payload is nested far more than {MAX_DEPTH} levels deep") from None
        except ValueError:  # json's two refusals here; the field checks would give the path, but size comes first
            raise OpRejected("payload cannot be written as JSON: it holds a circular reference "
                             "or an integer of more than 4300 digits") from None
        if size > MAX_OP_BYTES:
            raise OpRejected(f"payload is {size} bytes; the limit is {MAX_OP_BYTES} bytes per operation")
        return data

    @field_validator("layer", mode="plain")
    @classmethod
    def _layer(cls, layer: Any) -> str:
        if layer is None:
            return cls.WRITES[0]
        if not isinstance(layer, str) or layer not in LAYERS:
            raise OpRejected(f"unknown layer {layer!r}; layers are {', '.join(LAYERS)}")
        if layer not in cls.WRITES:
            op = cls.model_fields["op"].default
            raise OpRejected(f"layer {layer!r} does not fit {op} (it writes {' or '.join(cls.WRITES)})")
        return layer


class UpsertNode(_Op):
    """Update the node of this label (and layer) in the exact scope, else insert it."""

    WRITES = ("semantic", "working")
    op: Literal["upsert_node"] = "upsert_node"
    importance: Importance = None
    label: Label = None
    properties: JsonObject = None


class CreateEvent(_Op):
    """One episodic event."""

    WRITES = ("episodic",)
    op: Literal["create_event"] = "create_event"
    content: Text = None
    metadata: JsonObject = None
    session_id: OptionalLabel = None


class SetTrigger(_Op):
    """A pending prospective trigger."""

    WRITES = ("prospective",)
    op: Literal["set_trigger"] = "set_trigger"
    due_at: Timestamp = None
    condition: Text = None
    action: Text = None


class RegisterSkill(_Op):
    """A procedural skill, filed as ``draft`` whatever ``status`` asks (which is then a note)."""

    WRITES = ("procedural",)
    op: Literal["register_skill"] = "register_skill"
    #: the status asked for, when it is not ``draft`` (it is not used: it becomes a note on the receipt)
    status: Annotated[str | None, PlainValidator(lambda v: v if isinstance(v, str) and v != "draft" else None)] = None
    name: Label = None
    description: OptionalText = None
    steps: JsonList = None


class Thinking(_Op):
    """A thought: a working-memory node that expires (``ttl_hours``)."""

    WRITES = ("working",)
    op: Literal["thinking"] = "thinking"
    text: Text = None


class ReadNode(_Op):
    """A read of a node visible from the scope: logged, nothing else."""

    WRITES = ("semantic", "working")
    op: Literal["read_node"] = "read_node"
    id: NodeId = None


_MODELS = (UpsertNode, CreateEvent, SetTrigger, RegisterSkill, Thinking, ReadNode)
#: A checked operation: the model its ``op`` names.
Op = Annotated[Union[_MODELS], Field(discriminator="op")]  # noqa: UP007 (a tuple of types needs Union[...])
OPS = tuple(m.model_fields["op"].default for m in _MODELS)
_OP = TypeAdapter(Op)


def op_name(op: Any) -> str:
    """The name an operation gives itself, ``"?"`` if it gives none (what a rejection is filed under)."""
    name = op.get("op") if isinstance(op, dict) else None
    return name if isinstance(name, str) else "?"


def check_op(index: int, op: Any, *, max_label_chars: int = MAX_LABEL_CHARS,
             max_label_bytes: int | None = None) -> tuple[Op, tuple[str, ...]]:
    """The checked operation ``ops[index]`` and the paths of the credentials redacted in it, or
    :class:`OpRejected` with the first reason it fails.  ``max_label_chars``: the longest label
    accepted (at most :data:`MAX_LABEL_CHARS`; ``record_turn`` passes the quarantine's bound when it is
    lower); ``max_label_bytes``: the UTF-8 bytes a label or skill name may take (``record_turn``
    passes what its scope path leaves of :data:`MAX_INDEXED_BYTES`)."""
    if not isinstance(op, dict):
        raise OpRejected(f"an operation must be a JSON object, got {type(op).__name__}")
    name = op.get("op")
    if not isinstance(name, str):
        raise OpRejected("field 'op' is missing" if name is None else f"field 'op' must be a string, got {type(name).__name__}")
    if name not in OPS:
        raise OpRejected(f"unknown op {name[:60]!r}; ops are {', '.join(OPS)}")
    redacted: list[str] = []
    try:
        checked = _OP.validate_python(op, context={"index": index, "redacted": redacted, "max_label_bytes": max_label_bytes,
                                                   "max_label_chars": min(max_label_chars, MAX_LABEL_CHARS)})
    except ValidationError as exc:
        raise OpRejected(_reason(exc.errors()[0])) from None
    return checked, tuple(redacted)


def _reason(error: dict) -> str:
    """Our reason for pydantic's first error: the OpRejected a validator raised, as it was worded."""
    raised = error.get("ctx", {}).get("error")
    if isinstance(raised, OpRejected):
        return str(raised)
    return f"{'.'.join(map(str, error['loc'][1:])) or 'operation'}: {error['msg']}"  # not expected: every check is ours
