"""The nodes of a job: DeepSpeed hostfiles, plain host lists and Slurm node lists, with validated names."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from zdoctor.core.errors import InputError
from zdoctor.layers.offload.dsconfig import read_text

#: One DNS label (underscores allowed: clusters use them), 1-63 characters, no leading or trailing hyphen.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\Z")
_SLOTS = re.compile(r"slots=(\d+)\Z")
#: Hosts a fleet run accepts at most (a typo in a Slurm range must not fork a million launchers).
MAX_HOSTS = 4096


@dataclass(frozen=True)
class Node:
    """One node of the job: its name as the launcher reaches it, and DeepSpeed's ``slots`` when given."""

    name: str
    slots: int | None = None
    line: int | None = None


def host_problem(name: str) -> str | None:
    """Why ``name`` cannot be a host name or address, or None when it can.

    Accepted: DNS names (labels of letters, digits, ``-`` and ``_``), IPv4 and IPv6 addresses. Nothing
    that a launcher or ssh could read as an option, a user, a range or a list (``-x``, ``a@b``, ``a,b``,
    ``n[1-2]``, ``^file``), and no whitespace or shell characters.
    """
    if not name:
        return "empty host name"
    if len(name) > 253:
        return "host name longer than 253 characters"
    if ":" in name:
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return "not a host name or IPv6 address"
        return None
    labels = name.split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return "not a valid IPv4 address"
        return None
    bad = next((label for label in labels if not _LABEL.match(label)), None)
    if bad is not None:
        if name.startswith("-"):
            return "starts with '-' (a launcher would read it as an option)"
        odd = sorted({c for c in name if not ((c.isascii() and c.isalnum()) or c in ".-_")})
        if odd:
            return f"contains {' '.join(repr(c) for c in odd)} (letters, digits, '.', '-' and '_' only)"
        return "has an empty or malformed label"
    return None


def validate_host(name: str, where: str) -> str:
    """``name`` if it is a valid host, else an :class:`InputError` naming ``where`` it came from."""
    problem = host_problem(name)
    if problem:
        raise InputError(f"{where}: host {name!r}: {problem}")
    return name


def parse_hostfile(text: str, source: str) -> list[Node]:
    """Nodes of a DeepSpeed hostfile (``worker-1 slots=8``) or a plain list of hosts, one per line.

    ``#`` starts a comment (a whole line or the rest of one); blank lines are skipped. As in DeepSpeed,
    a host named twice is an error. Any problem is an :class:`InputError` with the line number.
    """
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        fields = line.split()
        slots = None
        if len(fields) > 2:
            raise InputError(f"{where}: expected 'HOST' or 'HOST slots=N', got {line!r}")
        if len(fields) == 2:
            m = _SLOTS.match(fields[1])
            if not m:
                raise InputError(f"{where}: expected 'slots=N' after the host, got {fields[1]!r}")
            slots = int(m.group(1))
        name = validate_host(fields[0], where)
        if name in seen:
            raise InputError(f"{where}: host {name!r} is listed twice (first on line {seen[name]})")
        seen[name] = lineno
        nodes.append(Node(name, slots, lineno))
        if len(nodes) > MAX_HOSTS:
            raise InputError(f"{source}: more than {MAX_HOSTS} hosts")
    if not nodes:
        raise InputError(f"{source}: no hosts (only comments or blank lines)")
    return nodes


def read_hostfile(path: str) -> list[Node]:
    """Read and parse a hostfile; missing, unreadable, huge or binary files are one-line InputErrors."""

    return parse_hostfile(read_text(path, "hostfile", cap=4 * 1024 * 1024), path)


def _split_top(text: str) -> list[str]:
    """Split a Slurm host list on the commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if depth:
        raise ValueError("unbalanced '['")
    parts.append("".join(cur))
    return parts


def _expand_range(spec: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {item!r}")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError(f"range {item!r} runs backwards")
        if b - a >= MAX_HOSTS:
            raise ValueError(f"range {item!r} has more than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(i).zfill(width) for i in range(a, b + 1))
    return out


def _expand_one(pattern: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", pattern)
    if not m:
        return [pattern]
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [h for mid in _expand_range(m.group(1)) for h in _expand_one(head + mid + tail)]


def expand_nodelist(text: str, source: str = "SLURM_JOB_NODELIST") -> list[Node]:
    """Expand a Slurm node list (``gpu[01-03,07],login1``, ``rack[1-2]-n[1-2]``) into validated nodes."""
    try:
        names = [h for part in _split_top(text.strip()) if part for h in _expand_one(part)]
    except ValueError as exc:
        raise InputError(f"{source}: malformed node list {text!r}: {exc}") from None
    if not names:
        raise InputError(f"{source}: empty node list")
    if len(names) > MAX_HOSTS:
        raise InputError(f"{source}: more than {MAX_HOSTS} hosts")
    nodes: list[Node] = []
    for name in dict.fromkeys(names):
        nodes.append(Node(validate_host(name, source)))
    return nodes
