"""Why an ``ssh`` login failed, from what ssh printed (OpenSSH's own messages), and the remedy for each.

``classify("user@n2: Permission denied (publickey).")`` -> ``"publickey"``. Pure.
"""

from __future__ import annotations

import re
import shlex

#: (kind, OpenSSH's message) in the order they are tried: the host key check comes before the login.
MESSAGES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("resolve", re.compile(r"Could not resolve hostname")),
    ("refused", re.compile(r"port \d+: Connection refused")),
    ("timed out", re.compile(r"port \d+: (?:Connection|Operation) timed out")),
    ("unreachable", re.compile(r"port \d+: (?:No route to host|Network is unreachable)")),
    ("reset", re.compile(r"Connection reset by|Connection closed by|kex_exchange_identification")),
    ("host key changed", re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for \S+ has changed")),
    ("host key unknown", re.compile(r"Host key verification failed|No \S+ host key is known for")),
    ("publickey", re.compile(r"Permission denied \((?:publickey|[a-z,-]*publickey)[a-z,-]*\)")),
    ("password", re.compile(r"Permission denied \((?:password|keyboard-interactive)[a-z,-]*\)")),
)
#: What each kind means, for a finding's words.
MEANING = {
    "resolve": "the name does not resolve on this node",
    "refused": "nothing listens on the host's ssh port",
    "timed out": "no answer: a firewall drops the packets, or the host is down",
    "unreachable": "no route from this node to the host",
    "reset": "the server closed the connection before the login (sshd's MaxStartups, tcp wrappers, a proxy)",
    "host key changed": "the host's key differs from the one this user's known_hosts holds for it (the host was "
                        "reinstalled, or something else answers at its address)",
    "host key unknown": "this user has never accepted the host's key, and without a terminal ssh cannot ask",
    "publickey": "the server accepts keys only, and none of this user's keys is in the account's "
                 "authorized_keys there",
    "password": "the server asks for a password, which a launcher cannot type",
}
_OFFENDING = re.compile(r"Offending \S+ key in (?P<file>\S+):(?P<line>\d+)")
#: ssh's own advice under a changed key: ``ssh-keygen -f "FILE" -R "[HOST]:PORT"`` (the name as known_hosts has it).
_REMOVE_WITH = re.compile(r"ssh-keygen -f \"[^\"\n]+\" -R \"(?P<name>[^\"\n]+)\"")


def classify(said: str) -> str:
    """The kind of ssh failure ``said`` (ssh's stderr) shows, or ``other``."""
    for kind, rx in MESSAGES:
        if rx.search(said or ""):
            return kind
    return "other"


def offending_file(said: str) -> str | None:
    """The known_hosts file ssh names for a changed host key."""
    m = _OFFENDING.search(said or "")
    return m.group("file") if m else None


def remedy_commands(kind: str, host: str, port: str | None = None, said: str = "") -> list[str]:
    """The commands that fix ``kind`` for ``host``, run as the training user on this node (empty: none here)."""
    h = shlex.quote(host)
    p = f"-p {shlex.quote(str(port))} " if port else ""
    if kind == "publickey":
        return ["test -f ~/.ssh/id_ed25519 || ssh-keygen -q -t ed25519 -N '' -f ~/.ssh/id_ed25519",
                f"ssh-copy-id -i ~/.ssh/id_ed25519.pub {p}{h}"]
    if kind == "host key changed":
        known = offending_file(said)
        advised = _REMOVE_WITH.search(said or "")
        name = advised.group("name") if advised else f"[{host}]:{port}" if port and str(port) != "22" else host
        return [f"ssh-keygen -R {shlex.quote(name)}" + (f" -f {shlex.quote(known)}" if known else ""),
                f"ssh -o StrictHostKeyChecking=accept-new {p}{h} true"]
    if kind == "host key unknown":
        return [f"ssh -o StrictHostKeyChecking=accept-new {p}{h} true"]
    return []
