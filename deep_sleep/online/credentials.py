"""What counts as a credential in a live turn, and its redaction (SPEC §5: "property keys that look
like credentials … are redacted before anything is stored").

Two rules, both applied before anything is stored:

**Keys.**  The value of a property / metadata / step key that looks like a credential becomes
``"[REDACTED]"`` (:func:`is_credential_key`).  A key is read as words: Unicode NFKC, split at
camelCase, case-folded (``ß`` → ``ss``), accents and invisible format characters dropped
(``contraseña`` → ``contrasena``, ``pass\\u200bword`` → ``password``), split at
every character that is not a letter or digit and between letters and digits — and once more with
leetspeak read as letters (``p@ssw0rd``, ``pa$$word``, ``s3cr3t``).  It is a credential when

- a word, or two or three adjacent words joined, is one of :data:`CREDENTIAL_WORDS` — ``password``,
  ``secret``, ``token``, ``passcode``, ``jwt``, ``auth``, ``cookie``, ``dsn``, ``api key``,
  ``private key``, ``ssh key``, ``signing key``, ``encryption key``, ``database url``, … and the
  word for password in other languages (``пароль``, ``contraseña``, ``kennwort``, ``passwort``,
  ``mot de passe``, ``senha``, ``wachtwoord``, ``hasło``, …);
- its last word (numbers aside: ``db_pass_2``) is ``pass``, ``pw`` or ``pswd`` — so ``db_pass`` and
  ``userPw`` are redacted and ``pass_rate`` is not;
- a word is one of :data:`SOLO_WORDS`, names that are a credential only when written as one word:
  the web session cookies ``sessionid``, ``jsessionid``, ``phpsessid``.  ``session_id`` and
  ``sessionId`` are *not* redacted: in an agent's memory a session is the conversation, whose id
  ``record_turn`` files in its own column;
- it contains the word for password or key in a language written without spaces (``密码``,
  ``パスワード``, ``비밀번호``, ``令牌``…);
- a word is a credential written as one word of several (issue 37): it holds ``password``,
  ``passwd``, ``passphrase``, ``passcode`` or ``credential`` anywhere (``userpassword``), ends with
  ``token(s)``, ``secret(s)`` or ``creds`` (``accesstoken``, ``apisecret``), or is made end to end of
  credential words and the words of :data:`PARTS` that go before them — ``x``, ``api``, ``auth``,
  ``access``, ``secret``, ``user``, ``root``, ``key``… — with at least one credential word among
  them or ``pass``/``pw`` last (``xapikey``, ``authkey``, ``secretaccesskey``, ``rootpw``).  So
  ``monkey``, ``keyboard``, ``tokenizer``, ``secretary``, ``credit`` and ``userkey`` are not
  credentials (``mon``, ``board``, ``izer``, ``ary``, ``it`` are not parts; ``user`` and ``key`` are
  no credential word);

and the key is read once more without the camelCase split, so ``PaSsWoRd`` is ``password`` and
``userPassword`` a compound of it (the one-word cookie names count only as written: ``sessionId``
stays a session id).

**Values.**  Any string a turn stores — property values under any key, event contents, thoughts,
labels, skill steps — has the secrets of well-known formats replaced by ``[REDACTED]``
(:func:`redact_text`): the password of a URL (``postgres://app:[REDACTED]@db/prod``), AWS access key
ids (``AKIA…``), JSON Web Tokens (``eyJ….eyJ….…``), PEM private key blocks, ``sk-…`` API keys
(OpenAI, Anthropic), Stripe ``sk_live_…``/``rk_live_…``, GitHub ``ghp_…``/``github_pat_…``, GitLab
``glpat-…``, Slack ``xox?-…``, Google ``AIza…``, and the value of a ``password=…`` / ``API_KEY=…``
style assignment.

Over-redaction, on purpose (a lost value costs less than a stored secret): ``max_tokens`` and
``token_count`` (``token``), ``auth_method`` (``auth``), ``password_policy`` (``password``),
``api_key_id`` (``api key``), ``boarding_pass`` and ``first_pass`` (last word ``pass``), ``topsecret``
and ``street_cred``, a Russian
``пароль`` that is a countersign, and free text that happens to match a format (``sk-`` followed by
20 letters and digits, ``x://a:b@c``).

    >>> [k for k in ("db_pass", "sshKey", "p@ssword", "mot_de_passe", "pass_rate", "session_id") if is_credential_key(k)]
    ['db_pass', 'sshKey', 'p@ssword', 'mot_de_passe']
    >>> redact_text("postgres://app:hunter2@db:5432/prod")
    ('postgres://app:[REDACTED]@db:5432/prod', 1)
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

__all__ = ["CONTAINED", "CREDENTIAL_WORDS", "ENDINGS", "LAST_WORDS", "PARTS", "REDACTED", "SOLO_WORDS", "is_credential_key",
           "redact_text"]

REDACTED = "[REDACTED]"


def _fold(text: str) -> str:
    """Case-folded, accents and invisible format characters dropped (``pass\u200bword`` is ``password``)."""
    text = unicodedata.normalize("NFKD", text.casefold())
    kept = (ch for ch in text if not unicodedata.combining(ch) and unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFC", "".join(kept))


#: Words (and two or three adjacent words joined) that make a key a credential, folded as keys are.
CREDENTIAL_WORDS = frozenset(_fold(w) for w in
    """password passwords passwd passphrase passcode passcodes pwd secret secrets token tokens credential
    credentials cred creds authorization auth cookie cookies bearer pin otp totp hotp cvv cvc dsn jwt jwts apikey apikeys
    privatekey privkey accesskey secretkey sessionkey clientsecret connectionstring sshkey signingkey
    encryptionkey decryptionkey masterkey hmackey deploykey licensekey databaseurl databaseuri dburl dburi
    passwort kennwort motdepasse contrasena senha wachtwoord haslo hasło losenord passord adgangskode kodeord
    salasana jelszo sifre heslo katasandi matkhau пароль лозинка סיסמה كلمةالمرور كلمةالسر पासवर्ड""".split()
)
#: Words that make a key a credential only as its last word (``db_pass``, not ``pass_rate``).
LAST_WORDS = frozenset({"pass", "pw", "pswd"})
#: Credentials only when written as one word (web session cookies), never as a join of words.
SOLO_WORDS = frozenset({"sessionid", "jsessionid", "phpsessid", "sessid"})
#: Credential words a longer word may hold anywhere (``userpassword``, ``adminpasswd``): no other word contains them.
CONTAINED = ("password", "passwd", "passphrase", "passcode", "credential")
#: Credential words a longer word may end with (``accesstoken``, ``apisecret``, ``awscreds``); ``tokenizer`` and
#: ``secretary`` do not end with them.
ENDINGS = ("token", "tokens", "secret", "secrets", "creds")
#: Words that go before a credential word in a key written as one word (``xapikey``, ``authkey``,
#: ``secretaccesskey``, ``rootpw``): a word that is these and credential words end to end (at least one of
#: them a credential word, or ending with ``pass``/``pw``) is a credential — ``monkey`` and ``keyboard``
#: are not (``mon`` and ``board`` are not among them).
PARTS = frozenset("""x my user users admin root access refresh session bearer api oauth id client app service account db
    database master private public secret signing ssh aws gcp azure login web hook webhook bot csrf xsrf personal github
    gitlab slack stripe google openai anthropic new old current temp reset recovery backup wifi smtp ftp ldap vault shared
    encryption decryption deploy license hmac basic key keys pass pw pswd""".split())
_PIECES = CREDENTIAL_WORDS | PARTS | LAST_WORDS
_LONGEST_PIECE = max(map(len, _PIECES))
#: Longer words are not taken apart (a key is a name, not a text).
_MAX_COMPOUND = 64


def _compound(word: str) -> bool:
    """Is ``word`` (folded, one word) a credential written as one word of several (``userpassword``,
    ``accesstoken``, ``xapikey``, ``secretaccesskey``, ``authkey``)?"""
    if len(word) < 4 or len(word) > _MAX_COMPOUND or word in _PIECES:  # one piece: the word rules decide
        return False
    if any(w in word for w in CONTAINED) or word.endswith(ENDINGS):
        return True
    # end to end: reach[i] = how word[:i] can be read as pieces: (holds a credential word, ends with a LAST_WORDS piece)
    reach: list[set[tuple[bool, bool]]] = [set() for _ in range(len(word) + 1)]
    reach[0].add((False, False))
    for i in range(len(word)):
        for j in range(i + 1, min(len(word), i + _LONGEST_PIECE) + 1) if reach[i] else ():
            piece = word[i:j]
            if piece in _PIECES:
                reach[j] |= {(cred or piece in CREDENTIAL_WORDS, piece in LAST_WORDS) for cred, _ in reach[i]}
    return any(cred or last for cred, last in reach[-1])


# Words of languages written without spaces: matched anywhere in the folded key.
_UNSPACED = tuple(_fold(w) for w in ("密码", "密碼", "口令", "密钥", "密鑰", "令牌", "パスワード", "暗証番号", "秘密鍵", "トークン", "비밀번호", "토큰"))

_LEET = (str.maketrans("@$!013457", "asioieast"), str.maketrans("@$!013457", "asioleast"))  # "1" read as i, then as l
_SPLIT = re.compile(r"[\W_]+|(?<=\d)(?=[^\W\d_])|(?<=[^\W\d_])(?=\d)")


def _camel(text: str) -> str:
    """``sshKey`` → ``ssh Key``, ``APIKey`` → ``API Key``, ``SessionID`` → ``Session ID`` (any script with case)."""
    out = []
    for i, ch in enumerate(text):
        if i and ch.isupper():
            prev, nxt = text[i - 1], text[i + 1] if i + 1 < len(text) else ""
            if prev.islower() or prev.isdigit() or (prev.isupper() and nxt.islower()):
                out.append(" ")
        out.append(ch)
    return "".join(out)


def _is_credential(words: list[str], solo: bool = True) -> bool:
    for n in (1, 2, 3):
        if any("".join(words[i:i + n]) in CREDENTIAL_WORDS for i in range(len(words) - n + 1)):
            return True
    if solo and any(w in SOLO_WORDS for w in words):
        return True
    if any(_compound(w) for w in words):
        return True
    named = [w for w in words if not w.isdigit()]
    return bool(named) and named[-1] in LAST_WORDS


@lru_cache(maxsize=8192)
def is_credential_key(key: str) -> bool:
    """Does a property key look like it holds a credential?  (The rule is the module's docstring.)

    >>> [k for k in ("api_key", "apiKey", "X-Api-Key", "AWS_SECRET_ACCESS_KEY", "author", "tokenizer", "password_hash") if is_credential_key(k)]
    ['api_key', 'apiKey', 'X-Api-Key', 'AWS_SECRET_ACCESS_KEY', 'password_hash']
    """
    normal = unicodedata.normalize("NFKC", key)
    folded = _fold(_camel(normal))
    if any(word in folded for word in _UNSPACED):
        return True
    for text in (folded, *(folded.translate(leet) for leet in _LEET)):
        if _is_credential([w for w in _SPLIT.split(text) if w]):
            return True
    # once more without the camelCase split: ``PaSsWoRd`` is password, ``userPassword`` a compound of it;
    # ``sessionId`` stays a session id (the cookie names of SOLO_WORDS count only as written)
    whole = _fold(normal)
    return _is_credential([w for w in _SPLIT.split(whole) if w], solo=False)


_SECRET_FORMATS = re.compile("|".join((
    r"(?P<url>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*:)(?P<urlpass>[^\s/@]+)(?=@)",  # scheme://user:PASSWORD@host
    r"(?P<assign>\b(?i:[a-z_]*(?:password|passwd|pwd|secret|token|api_?key))\s*=\s*)(?P<assigned>\"[^\"]*\"|'[^']*'|[^\s\"',;&]+)",
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END[A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",  # JWT: two base64url JSON objects and a signature
    r"\bsk-[A-Za-z0-9_-]{20,}",  # OpenAI / Anthropic (sk-proj-…, sk-ant-…)
    r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe secret and restricted keys
    r"\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{30,}",  # GitHub
    r"\bglpat-[A-Za-z0-9_-]{20,}",  # GitLab
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\bAIza[0-9A-Za-z_-]{35}",  # Google API keys
)))  # case-sensitive but for the assigned key: AKIA, eyJ and BEGIN are written so by their formats


# Text every match of _SECRET_FORMATS holds (case-insensitively for the assignment's "="): a text
# holding none of them cannot match, and `in` is far faster than the regex.
_MARKERS = ("://", "=", "PRIVATE KEY", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA", "eyJ", "sk-",
            "k_live_", "k_test_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "AIza")


def _replace(m: re.Match) -> str:
    if m.group("urlpass") is not None:
        return m.group("url") + REDACTED
    if m.group("assigned") is not None:
        return m.group("assign") + REDACTED
    return REDACTED


def redact_text(text: str) -> tuple[str, int]:
    """``text`` with every secret of a well-known format replaced by ``[REDACTED]``, and how many.

    >>> redact_text("key AKIAIOSFODNN7EXAMPLE, DB_PASSWORD=hunter2 and sk-ant-api03-abcdefghijklmnopqrstuv")
    ('key [REDACTED], DB_PASSWORD=[REDACTED] and [REDACTED]', 3)
    """
    if not any(marker in text for marker in _MARKERS):  # the common case, ~20x faster than the regex
        return text, 0
    return _SECRET_FORMATS.subn(_replace, text)
