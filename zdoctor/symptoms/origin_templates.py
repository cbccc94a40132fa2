"""Message templates in installed code: the ``raise``, ``assert`` and logging calls of a Python file, and the
printf format strings of a shared library's read-only data, each as a pattern a seen line can match.

A template is a list of parts: a literal string, or ``None`` for a value filled in at run time (an
f-string's ``{x}``, a ``%s``, a ``.format`` field, a concatenated variable). A site is where one template
is raised or logged, with the condition that guards it and the names that condition and message read.
"""

from __future__ import annotations

import ast
import contextlib
import re
from typing import Any, List, Optional

Template = List[Optional[str]]

#: Calls on these attributes of a logger are logging sites.
LOG_METHODS = frozenset({"error", "warning", "warn", "info", "critical", "exception", "fatal", "log_dist"})
#: A template matches only with at least this many literal characters (a bare ``f"{x}"`` says nothing).
MIN_LITERAL = 12
#: The guard's source text is cut to this many characters.
GUARD_CHARS = 240
#: A printf conversion (with flags, width, precision and length modifiers).
PRINTF = re.compile(r"%(?:%|[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|z|j|t|L|q)?[diouxXeEfFgGaAcspn])")
#: A ``str.format`` field.
FORMAT_FIELD = re.compile(r"\{\{|\}\}|\{[^{}]*\}")
#: A %-format field of Python (``%(name)s`` too).
PY_PERCENT = re.compile(r"%%|%(?:\([^)]*\))?[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[diouxXeEfFgGcrsa]")


def split_format(text: str, field: re.Pattern[str], escapes: dict[str, str]) -> Template:
    """``text`` with each ``field`` match made a wildcard (escaped braces or percents kept as text)."""
    parts: Template = []
    pos = 0
    for m in field.finditer(text):
        parts.append(text[pos:m.start()])
        parts.append(escapes.get(m.group()))
        pos = m.end()
    parts.append(text[pos:])
    return merge(parts)


def merge(parts: Template) -> Template:
    """Adjacent literals joined, adjacent wildcards made one, empty literals dropped."""
    out: Template = []
    for p in parts:
        if p == "":
            continue
        if p is not None and out and out[-1] is not None:
            out[-1] = str(out[-1]) + p
        elif p is None and out and out[-1] is None:
            continue
        else:
            out.append(p)
    return out


def printf_template(text: str) -> Template:
    """A C format string as a template (``%%`` is a percent sign)."""
    return split_format(text, PRINTF, {"%%": "%"})


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def template_of(node: ast.AST | None) -> Template:
    """The template of a message expression (a wildcard for anything computed)."""
    if node is None:
        return []
    text = _str(node)
    if text is not None:
        return [text]
    if isinstance(node, ast.JoinedStr):
        parts: Template = []
        for v in node.values:
            s = _str(v)
            parts.append(s if s is not None else None)
        return merge(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return merge([*template_of(node.left), *template_of(node.right)])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _str(node.left) is not None:
        return split_format(str(_str(node.left)), PY_PERCENT, {"%%": "%"})
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = _str(node.func.value)
        if base is not None:
            return split_format(base, FORMAT_FIELD, {"{{": "{", "}}": "}"})
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, (ast.Name, ast.Attribute)):
        return template_of(node.args[0])  # str(...), _(...), a wrapper around the message
    return [None]


def literal_chars(t: Template) -> int:
    return sum(len(p) for p in t if p is not None)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return ""


def _is_environ(node: ast.AST) -> bool:
    return _dotted(node) in ("os.environ", "environ")


def _in_environ(n: ast.Compare) -> bool:
    """``"NAME" in os.environ`` (or ``not in``)."""
    return any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops) and any(_is_environ(c) for c in n.comparators)


def names_read(nodes: list[ast.AST]) -> dict[str, list[str]]:
    """The names ``nodes`` read: config keys (string subscripts and ``.get("key")``), environment
    variables (``os.environ[...]``, ``os.environ.get``, ``os.getenv``) and attributes."""
    config: list[str] = []
    env: list[str] = []
    attrs: list[str] = []
    for root in nodes:
        for n in ast.walk(root):
            if isinstance(n, ast.Subscript):
                sl = n.slice
                sl = getattr(sl, "value", sl) if type(sl).__name__ == "Index" else sl  # Python 3.8's Index
                key = _str(sl) or _constant_name(sl)
                if key is not None:
                    (env if _is_environ(n.value) else config).append(key)
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args:
                key = _str(n.args[0]) or _constant_name(n.args[0])
                if key is None:
                    continue
                if n.func.attr == "getenv" or (n.func.attr == "get" and _is_environ(n.func.value)):
                    env.append(key)
                elif n.func.attr == "get":
                    config.append(key)
            elif isinstance(n, ast.Compare) and _str(n.left) is not None and _in_environ(n):
                env.append(str(_str(n.left)))
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and not n.attr.startswith("__"):
                attrs.append(n.attr)
    return {"config": list(dict.fromkeys(config))[:8], "env": list(dict.fromkeys(env))[:8],
            "attrs": list(dict.fromkeys(attrs))[:12]}


#: Base classes of a configuration model (pydantic's, DeepSpeed's): ``self.x`` there reads config key ``x``.
CONFIG_BASES = ("ConfigModel", "BaseModel", "Config", "BaseSettings")
#: A module-level name of a string constant (``TORCH_AUTOCAST = "torch_autocast"``), kept as ``$NAME`` until
#: the package's constants resolve it (:func:`resolve_constants`).
CONSTANT_NAME = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")


def _constant_name(node: ast.AST) -> str | None:
    return f"${node.id}" if isinstance(node, ast.Name) and CONSTANT_NAME.match(node.id) else None


def module_constants(tree: ast.AST) -> dict[str, str]:
    """The module-level ``NAME = "text"`` assignments of upper-case names."""
    out: dict[str, str] = {}
    for n in getattr(tree, "body", []):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            value = _str(n.value)
            if value is not None and CONSTANT_NAME.match(n.targets[0].id):
                out[n.targets[0].id] = value
    return out


def resolve_constants(sites: list[dict[str, Any]], constants: dict[str, set[str]]) -> None:
    """Each ``$NAME`` a site reads replaced by the string the package defines it as (dropped when no module
    or several define it differently: a name that is not known is not a key)."""
    for s in sites:
        reads = s.get("reads") or {}
        for kind in ("config", "env"):
            names = []
            for k in reads.get(kind) or []:
                if not k.startswith("$"):
                    names.append(k)
                elif len(constants.get(k[1:], ())) == 1:
                    names.append(next(iter(constants[k[1:]])))
            reads[kind] = list(dict.fromkeys(names))


def _segment(lines: list[str], node: ast.AST) -> str:
    """The source text of ``node`` (its lines cut at its columns; byte columns read as characters, which
    only shifts a cut in a line with non-ASCII text)."""
    first, last = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    start, end = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
    if first is None or last is None or start is None or end is None or last - first > 20:
        return ""
    chunk = lines[first - 1:last]
    if not chunk:
        return ""
    chunk[-1] = chunk[-1][:end]
    chunk[0] = chunk[0][start:]
    text = "\n".join(chunk)
    text = " ".join(text.split())
    return text if len(text) <= GUARD_CHARS else text[:GUARD_CHARS - 3] + "..."


def _is_logger(func: ast.AST) -> bool:
    if not isinstance(func, ast.Attribute) or func.attr not in LOG_METHODS:
        return False
    owner = _dotted(func.value).lower()
    return "log" in owner.rsplit(".", 1)[-1] if owner else False


#: Nodes no message site can be inside: not visited (a whole environment's modules hold millions of them).
_LEAVES = (ast.Constant, ast.Name, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
           ast.alias)


class _Sites(ast.NodeVisitor):
    """Every message site of one module, with the test of the innermost ``if`` it sits in (``not (...)`` in
    its ``else``)."""

    def __init__(self, source: str):
        self.lines = source.splitlines()
        self.guards: list[tuple[ast.AST, bool]] = []
        self.config_class = False
        self.sites: list[dict[str, Any]] = []

    def visit(self, node: ast.AST) -> None:
        """:meth:`ast.NodeVisitor.visit`, in the same order, without descending into :data:`_LEAVES`."""
        kind = node.__class__
        try:
            method = _VISITS[kind]
        except KeyError:
            method = _VISITS[kind] = None if issubclass(kind, _LEAVES) else getattr(
                _Sites, "visit_" + kind.__name__, _Sites.generic_visit)
        if method is not None:
            method(self, node)

    def generic_visit(self, node: ast.AST) -> None:
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    def _add(self, node: ast.AST, kind: str, message: ast.AST | None, guard: tuple[ast.AST, bool] | None) -> None:
        t = template_of(message)
        if literal_chars(t) < MIN_LITERAL:
            return
        text = ""
        if guard is not None:
            text = _segment(self.lines, guard[0])
            text = f"not ({text})" if guard[1] and text else text
        read = [x for x in (guard[0] if guard else None, message) if x is not None]
        reads = names_read(read)
        if self.config_class:  # a config model's fields, read as ``self.field``, are its config keys
            fields = [a.attr for x in read for a in ast.walk(x) if isinstance(a, ast.Attribute)
                      and isinstance(a.value, ast.Name) and a.value.id == "self"]
            reads["config"] = list(dict.fromkeys([*reads["config"], *fields]))[:8]
        self.sites.append({"line": getattr(node, "lineno", 0), "kind": kind, "template": t, "guard": text,
                           "reads": reads})

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        saved = self.config_class
        self.config_class = any(_dotted(b).endswith(CONFIG_BASES) for b in node.bases)
        self.generic_visit(node)
        self.config_class = saved

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self.guards.append((node.test, False))
        for n in node.body:
            self.visit(n)
        self.guards[-1] = (node.test, True)
        for n in node.orelse:
            self.visit(n)
        self.guards.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        saved, self.guards = self.guards, []  # a function's body is not guarded by the ifs around its definition
        self.generic_visit(node)
        self.guards = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def _guard(self) -> tuple[ast.AST, bool] | None:
        return self.guards[-1] if self.guards else None

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call) and exc.args:
            self._add(node, f"raise {_dotted(exc.func) or 'exception'}", exc.args[0], self._guard())
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        if node.msg is not None:
            self._add(node, "assert", node.msg, (node.test, False))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and _is_logger(func) and node.args:
            self._add(node, f"logger.{func.attr}", node.args[0], self._guard())
        self.generic_visit(node)


#: Each node class's visit method (None: a leaf, not visited), looked up once per class, not once per node.
_VISITS: dict[type, Any] = {}


def python_sites(source: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The message sites of one module's source and its string constants (none when it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [], {}
    v = _Sites(source)
    with contextlib.suppress(RecursionError):  # a very deep expression: the sites found so far
        v.visit(tree)
    return v.sites, module_constants(tree)
