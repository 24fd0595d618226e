"""Parse a model reply into memory operations, and give the reply back without them (SPEC §5).

A model that writes memory appends its operations to the reply.  Four shapes are recognised,
tried in this order; the first that finds a block wins:

1. ``<MEMORY_EXTRACT>…</MEMORY_EXTRACT>`` blocks (every one of them, case-insensitive);
2. a loose ``<GRAPH_OPERATIONS>`` block, closing tag optional: the JSON value right after the
   tag (a closing ``</GRAPH_OPERATIONS>`` right after it is stripped too);
3. a trailing fenced code block tagged ``json`` (only whitespace may follow it) holding
   operations (a block that is not valid JSON stays in the reply, with an error);
4. last resort, a backward scan for a bare JSON object or array at the end of the reply that
   looks like operations (a list of objects with ``op``, or an object with ``op`` or an
   operations key) — prose that merely ends in ``{…}`` is left alone.

The JSON inside may be a list of operations, one operation object, an object holding the list
under ``operations`` / ``ops`` / ``graph_operations`` / ``memory_operations``, or an object of
per-kind lists (``nodes`` → ``upsert_node``, ``events`` → ``create_event``, ``triggers`` →
``set_trigger``, ``skills`` → ``register_skill``, ``thoughts`` → ``thinking``).  An operation
naming itself with ``type`` or ``operation`` instead of ``op`` is renamed.  Nothing here
validates an operation: :func:`deep_sleep.online.turn.record_turn` does (the models of
:mod:`deep_sleep.online.ops`), and rejects bad ones by name.
A tagged block (1, 2) whose JSON cannot be read is still stripped from the reply; the error says why.

    >>> r = parse_reply('Noted!\\n<MEMORY_EXTRACT>[{"op": "upsert_node", "label": "user: Ada"}]</MEMORY_EXTRACT>')
    >>> r.text, r.operations, r.strategy
    ('Noted!', [{'op': 'upsert_node', 'label': 'user: Ada'}], 'memory_extract')
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from deep_sleep.online.errors import OnlineArgumentTypeError

__all__ = ["ParsedReply", "parse_reply", "operations_from_json"]

_EXTRACT = re.compile(r"<MEMORY_EXTRACT\s*>(.*?)</MEMORY_EXTRACT\s*>", re.IGNORECASE | re.DOTALL)
_GRAPH_OPEN = re.compile(r"<GRAPH_OPERATIONS\s*>", re.IGNORECASE)
_GRAPH_CLOSE = re.compile(r"\s*</GRAPH_OPERATIONS\s*>", re.IGNORECASE)
_FENCE_OPEN = re.compile(r"```[ \t]*json[ \t]*\r?\n", re.IGNORECASE)
_INNER_FENCE = re.compile(r"\A\s*```[ \t]*(?:json)?[ \t]*\r?\n?(.*?)\r?\n?```\s*\Z", re.IGNORECASE | re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")

LIST_KEYS = ("operations", "ops", "graph_operations", "memory_operations")
KIND_KEYS = {
    "nodes": "upsert_node",
    "events": "create_event",
    "triggers": "set_trigger",
    "skills": "register_skill",
    "thoughts": "thinking",
}
_NAME_ALIASES = ("type", "operation")
# How far back the bare-JSON scan looks for an opening bracket (a reply is not a novel).
_SCAN_LIMIT = 200_000
_SCAN_ATTEMPTS = 2_000


@dataclass(frozen=True)
class ParsedReply:
    """text: the reply with the operations block removed (trimmed); operations: what the block held,
    in order; strategy: which shape was found (memory_extract, graph_operations, json_fence,
    bare_json) or None; errors: blocks found but unreadable, with the JSON error."""

    text: str
    operations: list = field(default_factory=list)
    strategy: str | None = None
    errors: tuple[str, ...] = ()


def _loads(text: str) -> object:
    """Strict JSON, then once more without trailing commas (a common model slip)."""
    fenced = _INNER_FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        relaxed = _TRAILING_COMMA.sub(r"\1", text)
        if relaxed == text:
            raise
        return json.loads(relaxed)


def _named(op: object) -> object:
    if isinstance(op, dict) and "op" not in op:
        for alias in _NAME_ALIASES:
            if isinstance(op.get(alias), str):
                renamed = {k: v for k, v in op.items() if k != alias}
                return {"op": op[alias], **renamed}
    return op


def operations_from_json(value: object) -> list | None:
    """The operations a parsed JSON value holds, or None if it does not look like operations."""
    if isinstance(value, list):
        return [_named(v) for v in value]
    if not isinstance(value, dict):
        return None
    for key in LIST_KEYS:
        if isinstance(value.get(key), list):
            return [_named(v) for v in value[key]]
    named = _named(value)
    if "op" in named:  # one operation on its own
        return [named]
    kinds = [k for k in KIND_KEYS if isinstance(value.get(k), list)]
    if kinds:
        out: list = []
        for k in kinds:
            out += [{"op": KIND_KEYS[k], **item} if isinstance(item, dict) else item for item in value[k]]
        return out
    return None


def _looks_like_operations(value: object) -> bool:
    ops = operations_from_json(value)
    if not ops:
        return False
    return all(isinstance(o, dict) and "op" in o for o in ops)


def _join(before: str, after: str) -> str:
    before, after = before.rstrip(), after.strip()
    return f"{before}\n{after}".strip() if before and after else (before or after)


def _memory_extract(reply: str) -> ParsedReply | None:
    blocks = list(_EXTRACT.finditer(reply))
    if not blocks:
        return None
    ops: list = []
    errors: list[str] = []
    for i, m in enumerate(blocks):
        try:
            found = operations_from_json(_loads(m.group(1)))
        except json.JSONDecodeError as exc:
            errors.append(f"MEMORY_EXTRACT block {i + 1}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
            continue
        if found is None:
            errors.append(f"MEMORY_EXTRACT block {i + 1}: JSON holds no operations (expected a list or an object with 'operations')")
            continue
        ops += found
    text = reply
    for m in reversed(blocks):
        text = _join(text[: m.start()], text[m.end():])
    return ParsedReply(text.strip(), ops, "memory_extract", tuple(errors))


def _graph_operations(reply: str) -> ParsedReply | None:
    m = _GRAPH_OPEN.search(reply)
    if not m:
        return None
    rest = reply[m.end():]
    body = rest.lstrip()
    skipped = len(rest) - len(body)
    fence = re.match(r"```[ \t]*(?:json)?[ \t]*\r?\n?", body, re.IGNORECASE)
    if fence:
        body = body[fence.end():]
        skipped += fence.end()
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        close = _GRAPH_CLOSE.search(rest)
        tail = rest[close.end():] if close else ""
        return ParsedReply(_join(reply[: m.start()], tail), [], "graph_operations",
                           (f"GRAPH_OPERATIONS block: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",))
    after = body[end:]
    if fence:
        after = re.sub(r"\A\s*```", "", after)
    close = _GRAPH_CLOSE.match(after)
    if close:
        after = after[close.end():]
    found = operations_from_json(value)
    errors = () if found is not None else ("GRAPH_OPERATIONS block: JSON holds no operations",)
    return ParsedReply(_join(reply[: m.start()], after), found or [], "graph_operations", errors)


def _json_fence(reply: str) -> ParsedReply | None:
    if not re.search(r"```\s*\Z", reply):
        return None
    opening = None
    for opening in _FENCE_OPEN.finditer(reply):  # the last ```json opens the trailing block
        pass
    if opening is None:
        return None
    inner = re.sub(r"\r?\n?```\s*\Z", "", reply[opening.end():])
    try:
        value = _loads(inner)
    except json.JSONDecodeError as exc:
        # Left in place: it may be an example meant for the reader; the error says so.
        return ParsedReply(reply.strip(), [], "json_fence",
                           (f"trailing ```json block left in the reply: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",))
    found = operations_from_json(value)
    if found is None:
        return None  # a JSON example shown to the user, not memory operations
    return ParsedReply(reply[: opening.start()].strip(), found, "json_fence")


def _bare_json(reply: str) -> ParsedReply | None:
    text = reply.rstrip()
    if not text or text[-1] not in "}]":
        return None
    closer = text[-1]
    opener = "{" if closer == "}" else "["
    decoder = json.JSONDecoder()
    low = max(0, len(text) - _SCAN_LIMIT)
    pos = len(text)
    for _ in range(_SCAN_ATTEMPTS):
        pos = text.rfind(opener, low, pos)
        if pos < 0:
            return None
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            continue
        if end == len(text) and _looks_like_operations(value):
            return ParsedReply(text[:pos].strip(), operations_from_json(value) or [], "bare_json")
    return None


def parse_reply(reply: str) -> ParsedReply:
    """Find the operations in ``reply`` (see the module docstring for the order of strategies)."""
    if not isinstance(reply, str):
        raise OnlineArgumentTypeError(f"parse_reply: reply must be a string, got {type(reply).__name__}")
    for strategy in (_memory_extract, _graph_operations, _json_fence, _bare_json):
        found = strategy(reply)
        if found is not None:
            return found
    return ParsedReply(reply.strip())
