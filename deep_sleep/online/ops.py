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
characters with no control characters; texts :data:`MAX_TEXT_CHARS` characters; JSON nesting
:data:`MAX_DEPTH` levels; no NUL characters or lone surrogates anywhere (PostgreSQL cannot store
them); numbers finite.  Unknown extra fields are ignored.

The models check with our own plain validators, not pydantic's coercion: JSON's types, not
Python's (``True`` is not a number; ``"5"`` is not one either), and every reason is ours, naming
the field and the rule.  An op's checks run in a fixed order — the op's name, its size, its
layer, then its fields in declaration order — and the first that fails is the reason.

Before anything is stored, every property / metadata / step key that looks like a credential
(:func:`is_credential_key`: a word of the key — split at ``_ - . space`` and camelCase — or two
adjacent words joined, such as ``password``, ``secret``, ``token``, ``api_key``, ``apiKey``,
``private_key``, ``authorization``, ``credential``…, at any depth) gets the value ``"[REDACTED]"``.
It errs on the side of caution: ``max_tokens`` is redacted too.

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

from deep_sleep.core.snapshot import utc
from deep_sleep.online.errors import OpRejected

__all__ = [
    "LAYERS", "MAX_DEPTH", "MAX_LABEL_CHARS", "MAX_OPS_PER_TURN", "MAX_OP_BYTES", "MAX_TEXT_CHARS", "OPS", "REDACTED",
    "CreateEvent", "Op", "ReadNode", "RegisterSkill", "SetTrigger", "Thinking", "UpsertNode",
    "check_label", "check_op", "is_credential_key", "op_name", "redact",
]

MAX_OPS_PER_TURN = 256
MAX_OP_BYTES = 64 * 1024
MAX_LABEL_CHARS = 512
MAX_TEXT_CHARS = 16_000
MAX_DEPTH = 16
REDACTED = "[REDACTED]"
LAYERS = ("semantic", "working", "episodic", "procedural", "prospective")

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_KEY_SPLIT = re.compile(r"[^a-z0-9]+")
CREDENTIAL_WORDS = frozenset(
    """password passwords passwd passphrase pwd secret secrets token tokens credential credentials
    authorization auth cookie cookies bearer pin otp dsn apikey apikeys privatekey accesskey secretkey
    sessionkey clientsecret connectionstring""".split()
)


# ---------------------------------------------------------------------------------------------
# credentials and JSON values


def is_credential_key(key: str) -> bool:
    """Does a property key look like it holds a credential?

    >>> [k for k in ("api_key", "apiKey", "X-Api-Key", "AWS_SECRET_ACCESS_KEY", "author", "tokenizer", "password_hash") if is_credential_key(k)]
    ['api_key', 'apiKey', 'X-Api-Key', 'AWS_SECRET_ACCESS_KEY', 'password_hash']
    """
    words = [w for w in _KEY_SPLIT.split(_CAMEL.sub("_", key).lower()) if w]
    if any(w in CREDENTIAL_WORDS for w in words):
        return True
    if any(a + b in CREDENTIAL_WORDS for a, b in zip(words, words[1:])):
        return True
    return "".join(words) in CREDENTIAL_WORDS


def _storable(value: str, where: str) -> str:
    if "\x00" in value:
        raise OpRejected(f"{where} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise OpRejected(f"{where} is not valid Unicode (it holds a lone surrogate)") from None
    return value


def redact(value: Any, path: str, redacted: list[str], depth: int = 0) -> Any:
    """``value`` with every credential-looking key's value replaced by ``"[REDACTED]"`` (paths
    appended to ``redacted``); raises :class:`OpRejected` on what cannot be stored as JSON (the
    reason names the path)."""
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
        return _storable(value, path)
    if isinstance(value, float) and not math.isfinite(value):
        raise OpRejected(f"{path} is {value}; numbers must be finite")
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


def check_label(value: Any, name: str) -> str:
    """A label or name: a non-blank string of at most :data:`MAX_LABEL_CHARS` characters without
    control characters; raises :class:`OpRejected` naming ``name`` and the rule broken."""
    value = _typed(value, name, str, "a string", True)
    if not value.strip():
        raise OpRejected(f"field {name!r} is blank")
    if len(value) > MAX_LABEL_CHARS:
        raise OpRejected(f"field {name!r} has {len(value)} characters; the limit is {MAX_LABEL_CHARS}")
    bad = CONTROL.search(value)
    if bad:
        raise OpRejected(f"field {name!r} contains control character {bad.group()!r} at position {bad.start()}")
    return _storable(value, f"field {name!r}")


def _check_text(value: Any, name: str, required: bool) -> str | None:
    value = _typed(value, name, str, "a string", required)
    if value is None:
        return None
    if required and not value.strip():
        raise OpRejected(f"field {name!r} is blank")
    if len(value) > MAX_TEXT_CHARS:
        raise OpRejected(f"field {name!r} has {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
    return _storable(value, f"field {name!r}")


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
    if value is not None and not (math.isfinite(value) and 1.0 <= value <= 10.0):
        raise OpRejected(f"field 'importance' is {value}; it must be within [1, 10]")
    return None if value is None else float(value)


def _check_due_at(value: Any, info: ValidationInfo) -> datetime | None:
    value = _typed(value, info.field_name, str, "an ISO 8601 timestamp", False)
    try:
        return utc(value) if value is not None else None
    except ValueError:
        raise OpRejected(f"field 'due_at' is {value[:40]!r}, not an ISO 8601 timestamp") from None


def _check_node_id(value: Any, info: ValidationInfo) -> str:
    value = _typed(value, info.field_name, str, "a node id (UUID)", True)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise OpRejected(f"field 'id' is {value[:40]!r}, not a UUID") from None


Label = Annotated[str, PlainValidator(lambda v, info: check_label(v, info.field_name))]
OptionalLabel = Annotated[str | None, PlainValidator(lambda v, info: None if v is None else check_label(v, info.field_name))]
Text = Annotated[str, PlainValidator(lambda v, info: _check_text(v, info.field_name, True))]
OptionalText = Annotated[str, PlainValidator(lambda v, info: _check_text(v, info.field_name, False) or "")]
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
        size = len(json.dumps(data, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass"))
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


def check_op(index: int, op: Any) -> tuple[Op, tuple[str, ...]]:
    """The checked operation ``ops[index]`` and the paths of the credentials redacted in it, or
    :class:`OpRejected` with the first reason it fails."""
    if not isinstance(op, dict):
        raise OpRejected(f"an operation must be a JSON object, got {type(op).__name__}")
    name = op.get("op")
    if not isinstance(name, str):
        raise OpRejected("field 'op' is missing" if name is None else f"field 'op' must be a string, got {type(name).__name__}")
    if name not in OPS:
        raise OpRejected(f"unknown op {name[:60]!r}; ops are {', '.join(OPS)}")
    redacted: list[str] = []
    try:
        checked = _OP.validate_python(op, context={"index": index, "redacted": redacted})
    except ValidationError as exc:
        raise OpRejected(_reason(exc.errors()[0])) from None
    return checked, tuple(redacted)


def _reason(error: dict) -> str:
    """Our reason for pydantic's first error: the OpRejected a validator raised, as it was worded."""
    raised = error.get("ctx", {}).get("error")
    if isinstance(raised, OpRejected):
        return str(raised)
    return f"{'.'.join(map(str, error['loc'][1:])) or 'operation'}: {error['msg']}"  # not expected: every check is ours
