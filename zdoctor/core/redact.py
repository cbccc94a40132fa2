"""Keep secrets out of session logs and exports.

:func:`redact` returns a deep copy of JSON-like data with secret values replaced by ``<redacted>``.

Which names hold secrets
------------------------
A name (a dict key, an environment variable, ``NAME=value`` in text, ``--name value`` in argv) is
split into word parts on ``_``, ``-``, ``.``, spaces and camelCase boundaries, then compared case-
insensitively, word by word (never as a plain substring):

* a part equal to ``token``, ``secret(s)``, ``password(s)``, ``passwd``, ``passphrase``,
  ``credential(s)``, ``auth``, ``authorization`` or ``key`` (``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``,
  ``AWS_SESSION_TOKEN``, ``WANDB_API_KEY``, ``AWS_ACCESS_KEY_ID``, ``ssh-key``, ``clientSecret``);
* or one of those words run together with a qualifier (``APIKEY``, ``authToken``... see
  ``_SECRET_WORDS``).

This covers every ``AWS_*``/``HF_*``/``WANDB_*`` variable that holds key material, while harmless
names that merely contain the letters pass: ``KEYBOARD``, ``keyring``, ``tiktoken`` and
``TOKENIZERS_PARALLELISM`` have no secret *part*; ``max_tokens`` is a count, so the plural ``tokens``
(and ``keys``, usually a list of dictionary keys) is not a secret word; ``PWD`` is the working
directory. A name whose last part says it points at or describes a secret rather than holding it
(``HF_TOKEN_PATH``, ``AWS_SHARED_CREDENTIALS_FILE``, ``SSH_KEY_DIR``, ``hf_token_set``, ``KeyError``) is kept, and so
are ``HF_HOME``, ``AWS_REGION``, ``WANDB_PROJECT``. ``pip freeze`` lines (``tiktoken==0.7.0``) are not
assignments.

A member of a JSON object named exactly ``key`` (lower case) is a record's field, the dotted path of a
setting (``{"key": "zero_optimization.offload_param.nvme_path"}``), and is kept; ``KEY=...``, ``--key x``
and ``{"KEY": ...}`` are still secrets.

Under a secret name only non-empty strings are replaced: ``None``, booleans and numbers ("is a token
set?", "how many?") carry no key material; a nested dict is searched by its own keys; list items are
redacted one by one.

Inside strings
--------------
``NAME=value``, ``export NAME=value``, ``NAME: value``, ``"NAME": "value"``, ``--name=value`` and
``--name value`` (a command line held as one string, ``--command "train.py --password x"``) for such
names. A name is never replaced, and neither is a value that holds nothing to hide: a switch's setting
(``PasswordAuthentication=no``, ``StrictHostKeyChecking=accept-new``), or the name of a setting under a
field called just ``key`` (``unknown key: ssh_key``). An unquoted value runs to the next blank, or to the
end of the line where the assignment opens it, as in ``env`` output (so ``HF_TOKEN=x python train.py``
keeps only ``HF_TOKEN=<redacted>``).
Also ``Bearer``/``Basic`` credentials, credentials in URLs (``https://user:pw@host``), PEM private key
blocks, and well-known token shapes: Hugging Face ``hf_...``, AWS access key ids ``AKIA...``/``ASIA...``,
GitHub ``ghp_...``/``github_pat_...``, ``sk-...`` API keys. Everything else (paths, versions,
``LD_LIBRARY_PATH=...``) passes unchanged. Redacting twice changes nothing more.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

REDACTED = "<redacted>"

#: Word parts that hold key material; only whole parts count (``tiktoken`` and ``keyring`` do not).
_SECRET_WORDS = frozenset({
    "token", "secret", "secrets", "password", "passwords", "passwd", "passphrase", "credential",
    "credentials", "authorization", "key", "auth",
    # the same words run together, as some tools spell them
    "apikey", "accesskey", "secretkey", "privatekey", "authkey", "signingkey", "masterkey", "sshkey",
    "licensekey", "encryptionkey", "authtoken", "accesstoken", "refreshtoken", "apitoken", "bearertoken",
    "idtoken", "sessiontoken", "hftoken", "clientsecret", "apisecret", "dbpassword",
})
#: A last part that makes the name describe a secret rather than hold it.
_POINTER_WORDS = frozenset({"path", "paths", "file", "files", "dir", "dirs", "home", "url", "location",
                            "name", "set", "present", "len", "length", "count", "type", "expiry",
                            "expiration", "expires", "error", "err", "exception", "warning", "sock",
                            "socket", "method", "mode", "scheme", "host", "port"})

_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def name_parts(name: str) -> list[str]:
    """Lower-case word parts of ``name`` (split on punctuation, blanks and camelCase)."""
    return [p.lower() for p in _SPLIT.split(name) if p]


#: Words no harmless name contains: a part holding one anywhere is a secret (``PGPASSWORD``, ``dbpasswd``).
_SECRET_STEMS = ("password", "passwd", "passphrase")
#: Secret only as the last part (``--pass``, ``--db-pass``; ``--pass-through`` is not).
_LAST_WORDS = frozenset({"pass"})


@functools.lru_cache(maxsize=8192)
def is_secret_name(name: str) -> bool:
    """Whether a variable or key called ``name`` holds key material (see the module docstring)."""
    parts = name_parts(name)
    if not parts or parts[-1] in _POINTER_WORDS:
        return False
    return (parts[-1] in _LAST_WORDS or any(p in _SECRET_WORDS for p in parts)
            or any(stem in p for p in parts for stem in _SECRET_STEMS))


# --- text ---------------------------------------------------------------------------------------

_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
                  re.DOTALL)
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+(?=@)")
#: ``user:pw@host`` without a scheme (``mysql://`` dropped, ``rsync``, ``lftp``): a word, a colon, the
#: password, ``@`` and a host name.
_BARE_CREDENTIALS = re.compile(r"(?P<head>(?<![^\s\"'=(])[A-Za-z0-9._%+-]+:)(?!<redacted>@)[^\s/@:\"']+"
                               r"(?=@[A-Za-z0-9][A-Za-z0-9.-]*(?![^\s/:\"')]))")
#: Tools whose ``-p`` takes the password itself (``mysql -pSECRET``, ``sshpass -p SECRET``).
_SHORT_P_TOOLS = re.compile(r"(?P<tool>(?<![^\s/\"'])(?:mysql[a-z]*|mariadb[a-z-]*|sshpass))(?P<args>[^\n|;&]*)")
_SHORT_P = re.compile(r"(?P<flag>(?<!\S)-p)(?P<gap>[ \t]*)(?P<value>(?!-)(?!<redacted>)(?:\\.|[^\s\\])+)")
#: ``Bearer``/``Basic`` and a credential: a whole word (never cut short) not followed by ``:`` (``basic auth:
#: required`` names a setting; it holds no credential).
_AUTH_SCHEME = re.compile(r"\b(?P<scheme>Bearer|Basic)(?P<gap>\s+)(?!<redacted>)"
                          r"(?=(?P<cred>[A-Za-z0-9._~+/=-]+))(?P=cred)(?!:)", re.IGNORECASE)
_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{40,}"
    r"|sk-(?:[A-Za-z0-9-]*-)?[A-Za-z0-9]{20,}"
    r")(?![A-Za-z0-9])"
)
_ASSIGN = re.compile(
    r"""(?P<lead>^[ \t]*(?:(?:export|declare\s+-x|setenv|set)[ \t]+)?)?
        (?<![A-Za-z0-9_.])(?P<q>["']?)(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=q)
        (?P<sep>[ \t]*(?P<op>[:=])(?!=)[ \t]*)
        (?P<value>"(?:[^"\\\n]|\\.)*"?|'[^'\n]*'?|(?:(?:Bearer|Basic|Token)[ \t]+)?(?:\\.|[^\s"'\\])*)""",
    re.VERBOSE | re.MULTILINE | re.IGNORECASE,
)
#: ``--password VALUE`` / ``-token VALUE`` inside a command line held as one string: the option, the
#: blanks after it, and a value that is not itself an option (quoted, or up to the next blank).
_OPTION_VALUE = re.compile(
    r"""(?<![^\s"'=])(?P<flag>--?(?P<name>[A-Za-z][A-Za-z0-9_.-]*))(?P<gap>[ \t]+)
        (?P<value>"(?:[^"\\\n]|\\.)*"?|'[^'\n]*'?|(?!-)(?:\\.|[^\s"'\\])+)""",
    re.VERBOSE,
)
#: Values that hold nothing to hide: empty, or already redacted.
_DONE = re.compile(r"(?:(?:Bearer|Basic|Token)[ \t]+)?(?:<redacted>)?", re.IGNORECASE)
#: Values that say how a setting is set, never what a secret is (``PasswordAuthentication=no``,
#: ``StrictHostKeyChecking=accept-new``).
_SWITCH = re.compile(r"yes|no|true|false|on|off|none|ask|accept-new|enabled?|disabled?|required|optional|"
                     r"prohibit-password|without-password|forced-commands-only|[01]", re.IGNORECASE)
#: A setting's own name (``ssh_key``, ``zero_optimization.stage``): what a field called ``key`` holds in
#: ``unknown key: ssh_key``, never key material.
_SETTING_NAME = re.compile(r"[a-z][a-z0-9]*(?:[_.][a-z][a-z0-9]*)+")


def harmless_value(name: str, value: str) -> bool:
    """Whether ``value``, under the secret-sounding ``name``, holds nothing to hide: empty or redacted, a
    switch's setting, or (under a name that is just ``key``) the name of a setting."""
    bare = value.strip("\"'")
    if _DONE.fullmatch(bare) or _SWITCH.fullmatch(bare):
        return True
    return name_parts(name) == ["key"] and bool(_SETTING_NAME.fullmatch(bare))


def _secret_values(text: str, pattern: re.Pattern[str], resume: str, found: list[str] | None = None) -> str:
    """Replace the ``value`` group of each ``pattern`` match whose ``name`` says secret.

    After a harmless name the scan resumes at the end of group ``resume``, so a secret nested in the value
    of another (``--env=HF_TOKEN=x``, ``sh -c 'train.py --password x'``) is still caught. A quoted value
    keeps its quotes; an unquoted one that opens a line (``lead``: ``env`` output, YAML, headers) runs to the
    end of that line, where a value may hold blanks.
    """
    out: list[str] = []
    pos = 0
    while True:
        m = pattern.search(text, pos)
        if m is None:
            break
        value = m.group("value")
        if not is_secret_name(m.group("name")) or harmless_value(m.group("name"), value):
            out.append(text[pos:m.end(resume)])
            pos = m.end(resume)
            continue
        quote = value[0] if value[:1] in ("\"", "'") else ""
        closed = quote and len(value) > 1 and value.endswith(quote)
        if found is not None:
            found.append(value[1:-1] if closed else value[len(quote):])
        out.append(text[pos:m.start("value")] + f"{quote}{REDACTED}{quote if closed else ''}")
        pos = m.end()
        if not quote and m.groupdict().get("lead") is not None:
            line_end = text.find("\n", m.start("value"))
            pos = len(text) if line_end < 0 else line_end
            if found is not None:
                found.append(text[m.start("value"):pos])
    out.append(text[pos:])
    return "".join(out)


def _short_p(text: str, found: list[str] | None) -> str:
    """``-pSECRET`` / ``-p SECRET`` after a tool whose ``-p`` is the password (``mysql``, ``sshpass``)."""
    def inner(m: re.Match[str]) -> str:
        if found is not None:
            found.append(m.group("value"))
        return m.group("flag") + m.group("gap") + REDACTED

    return _SHORT_P_TOOLS.sub(lambda t: t.group("tool") + _SHORT_P.sub(inner, t.group("args")), text)


def _sub(pattern: re.Pattern[str], text: str, found: list[str] | None, keep: tuple[str, ...] = ()) -> str:
    """Replace each match of ``pattern`` but its ``keep`` groups (a prefix) by ``<redacted>``."""
    def repl(m: re.Match[str]) -> str:
        head = "".join(m.group(g) for g in keep)
        if found is not None:
            found.append(m.group(0)[len(head):])
        return head + REDACTED

    return pattern.sub(repl, text)


#: What each pattern above needs somewhere in a text before it can match: a text with none of these is left
#: as it is without running them (most texts of a session: paths, versions, library names).
_MAYBE = re.compile(r"[=:@-]|hf_|AKIA|ASIA|gh[pousr]_|github_pat_|bearer|basic", re.IGNORECASE)


#: Texts already redacted, with what was found in them: a session records the same texts many times over
#: (a fact in a probe's result, in the findings that cite it, in each walk's steps). Bounded.
_MEMO: dict[str, tuple[str, tuple[str, ...]]] = {}
_MEMO_TEXT = 64 * 1024  # characters of one text kept, at most
_MEMO_TOTAL = 8 * 1024 * 1024  # characters of all texts kept, at most: then it starts over
_memo_size = [0]


def redact_text(text: str, found: list[str] | None = None) -> str:
    """``text`` with secret assignments, ``--secret VALUE`` options, credentials and token shapes replaced;
    each value replaced is appended to ``found`` when given."""
    if not text or not _MAYBE.search(text):
        return text
    hit = _MEMO.get(text)
    if hit is None:
        got: list[str] = []
        hit = (_redact_text(text, got), tuple(got))
        if len(text) <= _MEMO_TEXT:
            if _memo_size[0] + len(text) > _MEMO_TOTAL:
                _MEMO.clear()
                _memo_size[0] = 0
            _MEMO[text] = hit
            _memo_size[0] += len(text)
    if found is not None:
        found.extend(hit[1])
    return hit[0]


def _redact_text(text: str, found: list[str] | None) -> str:
    text = _sub(_PEM, text, found)
    text = _sub(_URL_CREDENTIALS, text, found, ("head",))
    text = _sub(_BARE_CREDENTIALS, text, found, ("head",))
    text = _sub(_AUTH_SCHEME, text, found, ("scheme", "gap"))
    text = _sub(_SHAPES, text, found)
    text = _short_p(text, found)
    text = _secret_values(text, _OPTION_VALUE, "flag", found)
    return _secret_values(text, _ASSIGN, "sep", found)


# --- data ---------------------------------------------------------------------------------------

_FLAG = re.compile(r"^--?(?P<name>[A-Za-z][A-Za-z0-9_.-]*)$")


#: Record fields spelled exactly so name what a record is about (a setting's dotted path, a dictionary
#: key), never key material: ``{"key": "zero_optimization.offload_param.nvme_path"}``.
_FIELD_NAMES = frozenset({"key"})


def _secret_member(name: str) -> bool:
    """Whether the member ``name`` of a JSON object holds a secret (see :data:`_FIELD_NAMES`)."""
    return name not in _FIELD_NAMES and is_secret_name(name)


def _secret_value(value: Any, found: list[str]) -> Any:
    """Replace a value found under a secret name (a switch's setting stays)."""
    if isinstance(value, str) and _SWITCH.fullmatch(value):
        return value
    if isinstance(value, (str, bytes)):
        if value and isinstance(value, str):
            found.append(value)
        return REDACTED if value else value
    if isinstance(value, dict):
        return _redact(value, found)
    if isinstance(value, (list, tuple)):
        return type(value)(_secret_value(v, found) for v in value)
    return copy.deepcopy(value)


#: argv words after which the next word is the password (``sshpass -p X``, ``mysql -p X``).
_PASSWORD_TOOLS = re.compile(r"(?:.*/)?(?:mysql[a-z]*|mariadb[a-z-]*|sshpass)")


def _redact_sequence(items: list[Any] | tuple[Any, ...], found: list[str]) -> list[Any] | tuple[Any, ...]:
    """Redact each item; an argv-style ``--token VALUE`` pair loses its value too, and so does ``-p X`` /
    ``-pX`` of a tool whose ``-p`` is the password."""
    out: list[Any] = []
    hide_next = False
    short_p = bool(items) and isinstance(items[0], str) and bool(_PASSWORD_TOOLS.fullmatch(items[0]))
    for item in items:
        if hide_next and isinstance(item, str) and not item.startswith("-"):
            if item:
                found.append(item)
            out.append(REDACTED if item else item)
            hide_next = False
            continue
        hide_next = False
        if isinstance(item, str):
            flag = _FLAG.match(item)
            hide_next = bool(flag and is_secret_name(flag.group("name"))) or (short_p and item == "-p")
            if short_p and item.startswith("-p") and len(item) > 2 and item[2:] != REDACTED:
                found.append(item[2:])
                out.append("-p" + REDACTED)
                continue
        out.append(_redact(item, found))
    return type(items)(out) if isinstance(items, tuple) else out


def _redact(obj: Any, found: list[str]) -> Any:
    if isinstance(obj, str):
        return redact_text(obj, found)
    if isinstance(obj, dict):
        return {k: (_secret_value(v, found) if isinstance(k, str) and _secret_member(k) else _redact(v, found))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return _redact_sequence(obj, found)
    return copy.deepcopy(obj)


#: A secret value shorter than this is not searched for elsewhere (``x`` would blank every x).
MIN_ECHO_LENGTH = 4


def _unescape(value: str) -> str:
    """A shell word's value as a program sees it (``a\\ b`` is ``a b``)."""
    return re.sub(r"\\(.)", r"\1", value)


def _replace_echoes(obj: Any, values: list[str]) -> Any:
    """``obj`` with every occurrence of each of ``values`` replaced (a command that printed its argv)."""
    if isinstance(obj, str):
        for v in values:
            obj = obj.replace(v, REDACTED)
        return obj
    if isinstance(obj, dict):
        return {k: _replace_echoes(v, values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_replace_echoes(v, values) for v in obj)
    return obj


def redact(obj: Any) -> Any:
    """A deep copy of ``obj`` with secret values replaced by ``<redacted>`` (see the module docstring).

    A value found anywhere in ``obj`` is also replaced wherever else it appears in ``obj``: the output
    of a command that prints its own arguments holds the password the command line was given."""
    found: list[str] = []
    out = _redact(obj, found)
    values = {w for v in found for w in (v, _unescape(v)) if len(w) >= MIN_ECHO_LENGTH and w != REDACTED}
    if not values:
        return out
    return _replace_echoes(out, sorted(values, key=len, reverse=True))
