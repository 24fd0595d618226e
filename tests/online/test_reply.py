"""Parsing a model reply into memory operations (deep_sleep/reply.py): a corpus of replies in, the
stripped reply, the operations and the strategy out."""

from __future__ import annotations

import pytest

from deep_sleep.online.reply import parse_reply

NODE = {"op": "upsert_node", "label": "user: Ada"}
EVENT = {"op": "create_event", "content": "Ada joined"}

CORPUS = [
    # (title, reply, expected text, expected operations, strategy, number of errors)
    (
        "memory_extract list",
        'Nice to meet you, Ada!\n<MEMORY_EXTRACT>[{"op": "upsert_node", "label": "user: Ada"}]</MEMORY_EXTRACT>',
        "Nice to meet you, Ada!", [NODE], "memory_extract", 0,
    ),
    (
        "memory_extract object with operations, in the middle, any case, fenced inside",
        'Hi.\n<memory_extract>\n```json\n{"operations": [{"op": "upsert_node", "label": "user: Ada"}]}\n```\n</Memory_Extract>\nBye.',
        "Hi.\nBye.", [NODE], "memory_extract", 0,
    ),
    (
        "two memory_extract blocks: both parsed, both stripped",
        'A <MEMORY_EXTRACT>{"op": "upsert_node", "label": "user: Ada"}</MEMORY_EXTRACT> B'
        ' <MEMORY_EXTRACT>[{"op": "create_event", "content": "Ada joined"}]</MEMORY_EXTRACT>',
        "A\nB", [NODE, EVENT], "memory_extract", 0,
    ),
    (
        "memory_extract with per-kind lists and a trailing comma",
        'Ok.<MEMORY_EXTRACT>{"nodes": [{"label": "user: Ada"},], "events": [{"content": "Ada joined"}]}</MEMORY_EXTRACT>',
        "Ok.", [NODE, EVENT], "memory_extract", 0,
    ),
    (
        "memory_extract with broken JSON: stripped, error named",
        "Sure.<MEMORY_EXTRACT>[{op: upsert_node}]</MEMORY_EXTRACT>",
        "Sure.", [], "memory_extract", 1,
    ),
    (
        "loose graph_operations without closing tag",
        'Saved.\n<GRAPH_OPERATIONS>\n[{"type": "upsert_node", "label": "user: Ada"}]',
        "Saved.", [NODE], "graph_operations", 0,
    ),
    (
        "graph_operations with closing tag and text after",
        'Saved. <GRAPH_OPERATIONS>{"ops": [{"op": "create_event", "content": "Ada joined"}]}</GRAPH_OPERATIONS> Anything else?',
        "Saved.\nAnything else?", [EVENT], "graph_operations", 0,
    ),
    (
        "graph_operations truncated mid-JSON: stripped to the end, error named",
        'Saved. <GRAPH_OPERATIONS>[{"op": "upsert_node", "label": "us',
        "Saved.", [], "graph_operations", 1,
    ),
    (
        "trailing json fence",
        'Here you go.\n\n```json\n[{"op": "upsert_node", "label": "user: Ada"}]\n```\n',
        "Here you go.", [NODE], "json_fence", 0,
    ),
    (
        "a json fence that is an example, not operations, stays",
        'Your config:\n```json\n{"debug": true}\n```',
        'Your config:\n```json\n{"debug": true}\n```', [], None, 0,
    ),
    (
        "a trailing json fence that is not valid JSON stays, with an error",
        'Here:\n```json\n[{"op": "upsert_node",]]\n```',
        'Here:\n```json\n[{"op": "upsert_node",]]\n```', [], "json_fence", 1,
    ),
    (
        "bare JSON at the end",
        'Done! {"operations": [{"op": "upsert_node", "label": "user: Ada"}]}',
        "Done!", [NODE], "bare_json", 0,
    ),
    (
        "bare JSON list at the end, with braces in the prose before it",
        'Use {name} as a placeholder. [{"op": "create_event", "content": "Ada joined"}]  ',
        "Use {name} as a placeholder.", [EVENT], "bare_json", 0,
    ),
    (
        "prose ending in braces that are not operations stays",
        'The set is {"a": 1}',
        'The set is {"a": 1}', [], None, 0,
    ),
    (
        "no block at all",
        "  Just talking.  ",
        "Just talking.", [], None, 0,
    ),
    (
        "memory_extract wins over a later json fence",
        '<MEMORY_EXTRACT>[{"op": "upsert_node", "label": "user: Ada"}]</MEMORY_EXTRACT>\nExample:\n```json\n[{"op": "x"}]\n```',
        'Example:\n```json\n[{"op": "x"}]\n```', [NODE], "memory_extract", 0,
    ),
    (
        "operations are passed through unvalidated (record_turn rejects by name)",
        '<MEMORY_EXTRACT>[42, {"op": "delete_all"}]</MEMORY_EXTRACT>',
        "", [42, {"op": "delete_all"}], "memory_extract", 0,
    ),
]


@pytest.mark.parametrize("title,reply,text,operations,strategy,errors", CORPUS, ids=[c[0] for c in CORPUS])
def test_reply_corpus(title, reply, text, operations, strategy, errors):
    parsed = parse_reply(reply)
    assert parsed.text == text, title
    assert parsed.operations == operations, title
    assert parsed.strategy == strategy, title
    assert len(parsed.errors) == errors, (title, parsed.errors)


def test_bare_json_scan_is_bounded_on_brace_heavy_prose():
    reply = "{" * 50_000 + "}"
    assert parse_reply(reply).operations == []


def test_parsed_operations_land_through_record_turn(store, scope):
    """The parser's output is what record_turn takes: parse, record, read back."""
    from deep_sleep.online.turn import record_turn
    from tests.storeutil import scalar

    parsed = parse_reply('Noted.\n<MEMORY_EXTRACT>[{"op": "upsert_node", "label": "user: Ada", '
                         '"properties": {"token": "t-123"}}, {"op": "upsert_node"}]</MEMORY_EXTRACT>')
    receipt = record_turn(store, scope, parsed.operations, nap=False)
    assert [x.op for x in receipt.landed] == ["upsert_node"]
    assert [(x.index, x.op) for x in receipt.rejected] == [(1, "upsert_node")]
    props = scalar(store, "SELECT properties FROM memory_nodes WHERE id = %s", receipt.landed[0].id)
    assert props == {"token": "[REDACTED]"}
