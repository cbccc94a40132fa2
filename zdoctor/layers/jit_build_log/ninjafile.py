"""The commands a ``build.ninja`` runs, evaluated as ninja evaluates them (the part of the manifest language
torch's JIT writes: top-level variables, rules, build edges with their own bindings; no include/subninja).

ninja expands a file-level variable where it is defined, a build edge's bindings in the file's scope, and a
rule's ``command`` in the edge's scope (the edge's bindings, then the rule's, then the file's), with ``$in``
and ``$out`` the edge's explicit inputs and outputs, each path shell-escaped (src/eval_env.cc, graph.cc
``EdgeEnv``, util.cc ``GetShellEscapedString``). The command string is what ninja hashes into its log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_VAR = re.compile(r"[A-Za-z0-9_-]+")
_SIMPLE_VAR = re.compile(r"[A-Za-z0-9_-]+")
_SAFE = re.compile(r"^[A-Za-z0-9_+\-./]*$")


@dataclass
class Edge:
    """One ``build`` line: its rule, explicit outputs and inputs, and its own bindings (raw)."""

    rule: str
    outputs: list[str]
    inputs: list[str]
    bindings: dict[str, str] = field(default_factory=dict)


@dataclass
class Manifest:
    variables: dict[str, str] = field(default_factory=dict)  # expanded
    rules: dict[str, dict[str, str]] = field(default_factory=dict)  # raw bindings
    edges: list[Edge] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    """Lines with ``$``-newline continuations joined (the next line's leading spaces dropped)."""
    out: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw if not buf else raw.lstrip(" ")
        dollars = len(line) - len(line.rstrip("$"))
        if dollars % 2 == 1:
            buf += line[:-1]
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def _split_paths(text: str) -> list[str]:
    """Space-separated paths of a build line, with ``$ ``, ``$:`` and ``$$`` unescaped."""
    paths, cur, i = [], "", 0
    while i < len(text):
        c = text[i]
        if c == "$" and i + 1 < len(text):
            cur += text[i + 1]
            i += 2
            continue
        if c == " ":
            if cur:
                paths.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur:
        paths.append(cur)
    return paths


def _colon(text: str) -> int:
    """Where the unescaped ``:`` of a build line is (-1 when none)."""
    i = 0
    while i < len(text):
        if text[i] == "$":
            i += 2
            continue
        if text[i] == ":":
            return i
        i += 1
    return -1


def expand(value: str, lookup) -> str:
    """``$name``, ``${name}``, ``$$``, ``$ ``, ``$:`` in ``value``, names looked up with ``lookup(name)``."""
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c != "$" or i + 1 >= len(value):
            out.append(c)
            i += 1
            continue
        nxt = value[i + 1]
        if nxt in "$ :":
            out.append(nxt)
            i += 2
        elif nxt == "{":
            end = value.find("}", i + 2)
            end = len(value) if end < 0 else end
            out.append(lookup(value[i + 2:end]))
            i = end + 1
        else:
            m = _SIMPLE_VAR.match(value, i + 1)
            if not m:
                out.append(c)
                i += 1
                continue
            out.append(lookup(m.group(0)))
            i = m.end()
    return "".join(out)


def parse(text: str) -> Manifest:
    """The variables, rules and edges of a build.ninja (never raises; what it does not know is skipped)."""
    man = Manifest()
    current: dict[str, str] | None = None
    for line in _logical_lines(text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith((" ", "\t")):
            key, sep, value = line.strip().partition("=")
            if sep and current is not None:
                current[key.strip()] = value.lstrip(" ")
            continue
        current = None
        if line.startswith("rule "):
            current = man.rules.setdefault(line[5:].strip(), {})
        elif line.startswith("build "):
            body = line[6:]
            at = _colon(body)
            if at < 0:
                continue
            outs = _split_paths(body[:at].split(" | ")[0] if " | " in body[:at] else body[:at])
            words = _split_paths(body[at + 1:])
            if not words:
                continue
            rule, rest = words[0], words[1:]
            explicit = []
            for w in rest:
                if w in ("|", "||", "|@"):
                    break
                explicit.append(w)
            edge = Edge(rule=rule, outputs=outs, inputs=explicit)
            man.edges.append(edge)
            current = edge.bindings
        elif re.match(r"^(pool|default|include|subninja)\b", line):
            continue
        else:
            key, sep, value = line.partition("=")
            if sep and _VAR.fullmatch(key.strip()):
                man.variables[key.strip()] = expand(value.lstrip(" "), lambda n: man.variables.get(n, ""))
    return man


def shell_escape(path: str) -> str:
    """A path as ninja puts it into ``$in`` / ``$out`` on POSIX."""
    if _SAFE.match(path):
        return path
    return "'" + path.replace("'", "'\\''") + "'"


def command_of(man: Manifest, edge: Edge) -> str | None:
    """The command ninja runs (and hashes) for ``edge``; None for a phony edge or an unknown rule."""
    rule = man.rules.get(edge.rule)
    if edge.rule == "phony" or rule is None or "command" not in rule:
        return None
    built = {k: expand(v, lambda n: man.variables.get(n, "")) for k, v in edge.bindings.items()}
    seen: set[str] = set()

    def lookup(name: str) -> str:
        if name == "in":
            return " ".join(shell_escape(p) for p in edge.inputs)
        if name == "out":
            return " ".join(shell_escape(p) for p in edge.outputs)
        if name in built:
            return built[name]
        if name in rule and name not in seen:
            seen.add(name)
            try:
                return expand(rule[name], lookup)
            finally:
                seen.discard(name)
        return man.variables.get(name, "")

    return expand(rule["command"], lookup)


def commands(text: str) -> dict[str, str]:
    """``{first output: command}`` of every edge that runs one."""
    man = parse(text)
    out: dict[str, str] = {}
    for edge in man.edges:
        cmd = command_of(man, edge)
        if cmd is not None and edge.outputs:
            out[edge.outputs[0]] = cmd
    return out
