"""Credentials in a live turn (deep_sleep/online/credentials.py): every key the issue listed is
redacted, in the store too; secrets of well-known formats are redacted in any string; what is
over-redacted on purpose, and what is not redacted, is as documented."""

from __future__ import annotations

import pytest

from deep_sleep.online.credentials import REDACTED, is_credential_key, redact_text
from deep_sleep.online.turn import record_turn
from tests.online.helpers import NOW
from tests.storeutil import scalar

# issue 32's keys, then their spellings in other cases, separators and leetspeak
LISTED = ["db_pass", "pass", "pw", "jwt", "ssh_key", "sshKey", "signing_key", "encryption_key", "passcode", "sessionid",
          "DATABASE_URL", "p@ssword", "passw0rd", "пароль", "contraseña", "kennwort", "mot_de_passe"]
SPELLINGS = ["DB_PASS", "dbPass", "db-pw", "userPw", "db_pass_2", "JWT_TOKEN", "SSH_PRIVATE_KEY", "signingKey", "JSESSIONID",
             "databaseUrl", "P@SSW0RD", "pa$$word", "s3cr3t", "Пароль", "CONTRASEÑA", "Kennwort", "mot de passe", "motDePasse",
             "Passwort", "PAẞWORT", "senha", "wachtwoord", "hasło", "用户密码", "パスワード", "비밀번호", "pass\u200bword",
             "ｐａｓｓｗｏｒｄ", "password", "api_key", "apiKey", "X-Api-Key", "AWS_SECRET_ACCESS_KEY", "max_tokens"]
# not credentials (the last three: a session is the conversation, and pass/pw only count as the last word)
NOT = ["author", "authority", "tokenizer", "name", "keyboard", "key", "monkey", "passage", "secretary", "pinned", "passenger",
       "compass", "bypass", "passport", "display_name", "api_version", "s3_bucket", "top10", "x509", "session_id", "sessionId",
       "pass_rate"]


@pytest.mark.parametrize("key", LISTED + SPELLINGS)
def test_credential_keys_are_found_in_any_spelling(key):
    assert is_credential_key(key)


@pytest.mark.parametrize("key", NOT)
def test_words_that_only_contain_a_credential_word_are_not_credentials(key):
    assert not is_credential_key(key)


def test_what_is_over_redacted_on_purpose_is_redacted():
    assert all(is_credential_key(k) for k in ("max_tokens", "token_count", "auth_method", "password_policy", "api_key_id",
                                              "boarding_pass", "first_pass"))


@pytest.mark.parametrize(("text", "expected"), [
    ("connect to postgres://app:hunter2@db:5432/prod now", "connect to postgres://app:[REDACTED]@db:5432/prod now"),
    ("redis://:s3cret@cache:6379/0", "redis://:[REDACTED]@cache:6379/0"),
    ("AWS key AKIAIOSFODNN7EXAMPLE.", "AWS key [REDACTED]."),
    ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     "Bearer [REDACTED]"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n", "[REDACTED]\n"),
    ("key: sk-proj-abcdefghijklmnopqrstuvwx", "key: [REDACTED]"),
    ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345", "[REDACTED]"),
    ("stripe sk_live_abcdefghijklmnop1234", "stripe [REDACTED]"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789 and github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123",
     "[REDACTED] and [REDACTED]"),
    ("xoxb-1234567890-abcdefghij", "[REDACTED]"),
    ("DB_PASSWORD=hunter2 PORT=5432", "DB_PASSWORD=[REDACTED] PORT=5432"),
    ("host=db password='hunter 2' user=app", "host=db password=[REDACTED] user=app"),
])
def test_secrets_of_well_known_formats_are_redacted_in_any_text(text, expected):
    assert redact_text(text) == (expected, expected.count(REDACTED))


@pytest.mark.parametrize("text", ["see https://example.com:8443/docs", "mail ada@example.com", "sk-1 is a size",
                                  "the token limit is 4096", "ghp_short", "eyJ alone", "a=b"])
def test_ordinary_text_is_left_alone(text):
    assert redact_text(text) == (text, 0)


def test_no_listed_credential_reaches_the_store(store, scope):
    secrets = {key: f"secret-{i:03d}-value" for i, key in enumerate(LISTED)}
    formats = ["postgres://app:hunter2-pg@db/prod", "AKIAIOSFODNN7EXAMPLE", "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0"]
    receipt = record_turn(store, scope, [
        {"op": "upsert_node", "label": "user: Ada", "properties": {**secrets, "pass_rate": 0.9, "session_id": "s-1"}},
        {"op": "create_event", "content": f"Ada pasted {formats[0]} and {formats[1]}", "metadata": {"note": formats[2]}},
        {"op": "thinking", "text": f"remember {formats[2]}"},
    ], now=NOW, nap=False)
    assert not receipt.rejected
    assert sorted(receipt.redacted) == sorted([f"ops[0].properties.{k}" for k in LISTED]
                                              + ["ops[1].content", "ops[1].metadata.note", "ops[2].text"])
    props = scalar(store, "SELECT properties FROM memory_nodes WHERE id = %s", receipt.ids("upsert_node")[0])
    assert props == {**dict.fromkeys(LISTED, REDACTED), "pass_rate": 0.9, "session_id": "s-1"}
    with store.pg() as con:
        for secret in (*secrets.values(), "hunter2-pg", *formats[1:]):
            for table in ("memory_nodes", "episodic_events"):
                n = con.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", (f"%{secret}%",)).fetchone()[0]
                assert n == 0, (secret, table)


# Issue 37: keys written as one word, or in mixed case, that were stored in clear
COMPOUNDS = ["PaSsWoRd", "userpassword", "adminpassword", "rootpassword", "accesstoken", "ACCESSTOKEN", "authtoken",
             "refreshtoken", "sessiontoken", "bearertoken", "apitoken", "oauthtoken", "idtoken", "apisecret",
             "secretaccesskey", "xapikey", "authkey", "creds", "cred", "userPassword", "rootpw", "dbpass", "awscreds"]
# …and words a compound reading must leave alone
NOT_COMPOUNDS = ["hockey", "turkey", "donkey", "whiskey", "keynote", "keyword", "tokenize", "credit", "credits", "sacred",
                 "incredible", "accredited", "cookbook", "spinner", "passkey", "publickey", "keyId", "primaryKey",
                 "author_name", "SessionID", "userkey", "secretive"]


@pytest.mark.parametrize("key", COMPOUNDS)
def test_credential_words_joined_to_other_words_or_in_mixed_case_are_credentials(key):
    assert is_credential_key(key)


@pytest.mark.parametrize("key", NOT_COMPOUNDS)
def test_words_that_merely_hold_key_token_or_cred_are_not_credentials(key):
    assert not is_credential_key(key)


def test_no_compound_credential_reaches_the_store_in_properties_metadata_or_steps(store, scope):
    """Each of issue 37's spellings, in node properties, event metadata and a skill's steps (nested in
    a step object): redacted in the receipt and nowhere in the store in clear; non-credentials kept."""
    secrets = {key: f"clear-{i:03d}-value" for i, key in enumerate(COMPOUNDS)}
    keep = {key: f"kept-{i:03d}" for i, key in enumerate(NOT_COMPOUNDS)}
    receipt = record_turn(store, scope, [
        {"op": "upsert_node", "label": "service: billing", "properties": {**secrets, **keep}},
        {"op": "create_event", "content": "deployed billing", "metadata": {**secrets, **keep}},
        {"op": "register_skill", "name": "rotate billing creds", "steps": [{"run": "rotate", **secrets, **keep}]},
    ], now=NOW, nap=False)
    assert not receipt.rejected
    assert sorted(receipt.redacted) == sorted([f"ops[0].properties.{k}" for k in COMPOUNDS]
                                              + [f"ops[1].metadata.{k}" for k in COMPOUNDS]
                                              + [f"ops[2].steps[0].{k}" for k in COMPOUNDS])
    expected = {**dict.fromkeys(COMPOUNDS, REDACTED), **keep}
    assert scalar(store, "SELECT properties FROM memory_nodes WHERE id = %s", receipt.ids("upsert_node")[0]) == expected
    assert scalar(store, "SELECT metadata FROM episodic_events WHERE id = %s", receipt.ids("create_event")[0]) == expected
    assert scalar(store, "SELECT steps FROM procedural_skills WHERE id = %s", receipt.ids("register_skill")[0]) == [
        {"run": "rotate", **expected}]
    with store.pg() as con:
        for table in ("memory_nodes", "episodic_events", "procedural_skills"):
            n = con.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", ("%clear-%",)).fetchone()[0]
            assert n == 0, table
