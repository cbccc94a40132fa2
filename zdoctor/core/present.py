"""The report model: how statuses, counts, finding order, a remedy's verification, a finding's remedy
options (grouped by finding, with what comes first) and a printed script are put into words. The terminal
report, the Markdown and HTML exports, the fleet report and the TUI all take their marks, styles and
sentences from here, so they say the same thing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from zdoctor.core.model import visible_controls
from zdoctor.core.symptom import SOURCE_WORDS
from zdoctor.core.verdicts import (
    DEFAULT_NOT_TRIED,
    FIXED,
    NOT_FIXED,
    NOT_TRIED,
    TOOL_STARTS,
    Verification,
    verification_of,
)

#: One mark per status (Unicode), and the ASCII fallback for a terminal that cannot show them.
MARKS = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-", "crash": "‼"}
ASCII_MARKS = {"ok": "ok", "warn": "!!", "fail": "XX", "skip": "--", "crash": "!!!"}
#: The mark and style of each verification state.
VERIFICATION_MARKS = {FIXED: ("✓", "bold green"), TOOL_STARTS: ("~", "yellow"), NOT_FIXED: ("✗", "bold red"),
                      NOT_TRIED: ("?", "yellow")}
#: A probe that answered: its facts are not a verdict until a check judges them, so never the ✓ of ``ok``.
PROBE_ANSWERED = "·"
#: One rich style per status.
STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "crash": "bold magenta"}
#: The order statuses are counted in, in every summary line: worst first.
SUMMARY_ORDER = ("fail", "crash", "warn", "skip", "ok")

def mark(status: str, ascii_only: bool = False) -> str:
    """The mark for ``status`` (``?`` for an unknown one)."""
    return (ASCII_MARKS if ascii_only else MARKS).get(status, "?")


def style(status: str) -> str:
    """The rich style for ``status`` (none for an unknown one)."""
    return STYLES.get(status, "")


def summary_parts(counts: Mapping[str, Any], marks: bool = True, skip_zero: bool = False) -> list[tuple[str, str]]:
    """``(text, status)`` per status in :data:`SUMMARY_ORDER`, e.g. ``("✗ 2 fail", "fail")``."""
    out = []
    for s in SUMMARY_ORDER:
        n = counts.get(s, 0)
        if skip_zero and not n:
            continue
        out.append((f"{MARKS[s]} {n} {s}" if marks else f"{n} {s}", s))
    return out


def safe_text(text: Any) -> str:
    """Machine text made safe to show: control characters (escape sequences, carriage returns) as ``\\xNN``."""
    return visible_controls("" if text is None else str(text))


def verification_text(v: Verification, recorded_elsewhere: bool = False, with_reason: bool = True) -> str:
    """The one wording of a verification: ``tried: fixed``, ``tried: the tool starts`` (the failing command
    itself was not re-run), ``tried: did not fix``, ``not tried, because …``.

    ``recorded_elsewhere`` says the evidence came from another node (a replay or a practice scenario):
    then a try happened there, not on this machine.
    """
    where = " on the recorded node" if recorded_elsewhere else ""
    reason = v.reason.strip().rstrip(".")
    if v.state == FIXED:
        text = f"tried{where}: fixed"
    elif v.state == TOOL_STARTS:
        text = f"tried{where}: the tool starts"
    elif v.state == NOT_FIXED:
        text = f"tried{where}: did not fix"
    else:
        return f"not tried, because {reason or DEFAULT_NOT_TRIED}" if with_reason else "not tried"
    return f"{text} — {reason}" if with_reason and reason else text


def verification_mark(v: Verification) -> tuple[str, str]:
    """``(mark, style)`` of a verification state."""
    return VERIFICATION_MARKS.get(v.state, ("?", ""))


# --- remedies as alternatives ---------------------------------------------------------------------

#: Above a finding's remedies: they are alternatives; each one's lines are steps.
OPTIONS_HEADING = "Options: pick one (the first is recommended)"
ONE_OPTION_HEADING = "Fix"
SCRIPT_LABEL = "Run in bash, in order, before the launch command"
#: Above a script that changes the machine (a file, a package, a mount) rather than the launching shell.
MACHINE_SCRIPT_LABEL = "Run in bash, in order"
_SHELL_ONLY = re.compile(r"^\s*(?:export\s|unset\s|[A-Za-z_][A-Za-z0-9_]*=)")


def script_label(commands: Iterable[str]) -> str:
    """The line above a remedy's script: "before the launch command" only when every line changes the
    launching shell's environment (``export``, ``unset``, ``VAR=``); a script that writes a file, installs a
    package or mounts a disk does its work whenever it runs (and may act on new logins only). Above several
    lines it says that the printed block (:func:`pasted_script`) stops at the first line that fails."""
    lines = _command_lines(commands)
    label = SCRIPT_LABEL if only_changes_the_shell(lines) else MACHINE_SCRIPT_LABEL
    return f"{label} ({STOPS_NOTE})" if len(lines) > 1 else label


def _command_lines(commands: Iterable[str]) -> list[str]:
    return [str(c) for c in commands if str(c).strip() and not str(c).lstrip().startswith("#")]


#: Said after the label of a script of several lines: the printed block is one ``&&`` chain.
STOPS_NOTE = "pasted as one block, it stops at the first line that fails"


def _syntax(line: str) -> Iterator[tuple[int, str]]:
    """``(index, character)`` of each character of ``line`` the shell parses as syntax: outside quotes, not
    escaped, and not a quote or an escape itself."""
    quote = ""
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif quote:
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"':
                escaped = True
        elif ch == "\\":
            escaped = True
        elif ch in "'\"":
            quote = ch
        else:
            yield i, ch


def _comment_at(line: str) -> int | None:
    """Where a shell comment starts in ``line`` (a ``#`` at a word's start, outside quotes), or None."""
    return next((i for i, ch in _syntax(line) if ch == "#" and (i == 0 or line[i - 1].isspace())), None)


def _unquoted(line: str) -> str:
    """``line`` with its quoted parts (and escaped characters) taken out: what the shell parses as syntax."""
    return "".join(ch for _i, ch in _syntax(line))


def _grouped(command: str) -> str:
    """A one-line ``command`` whose own ``||`` or ``;`` would bind looser than the chain's ``&&``, in braces
    (``a && x || y`` would run ``y`` when ``a`` failed)."""
    if "\n" in command or _comment_at(command) is not None:
        return command
    bare = _unquoted(command)
    if "||" not in bare and ";" not in bare:
        return command
    return f"{{ {command.rstrip().rstrip(';')}; }}"


def _chained(command: str) -> str:
    """``command`` followed by `` &&``: at the end of its first line when it opens a here-document (the
    body and terminator follow), at the end of its last line otherwise (a quoted word may span lines),
    and before a trailing comment."""
    if "\n" in command and "<<" not in command.partition("\n")[0]:
        head, _, last = command.rpartition("\n")
        return f"{head}\n{_chained(last)}"
    first, newline, rest = command.partition("\n")
    cut = _comment_at(first)
    first = f"{first.rstrip()} &&" if cut is None else f"{first[:cut].rstrip()} && {first[cut:]}"
    return first + newline + rest


def pasted_script(commands: Iterable[str]) -> list[str]:
    """A remedy's lines as they are printed to be pasted: for several, one ``&&`` chain, so that a line that
    fails stops the rest (a failed ``findmnt --verify`` never lets the ``mv`` into /etc/fstab run). The chain
    runs in the shell it is pasted into, so its ``export`` and ``unset`` lines still reach it; comment lines
    stay as they are."""
    lines = [str(c) for c in commands if str(c).strip()]
    commands_at = [i for i, c in enumerate(lines) if not c.lstrip().startswith("#")]
    if len(commands_at) < 2:
        return lines
    last = commands_at[-1]
    lines = [_grouped(c) if i in commands_at else c for i, c in enumerate(lines)]
    return [_chained(c) if i in commands_at and i != last else c for i, c in enumerate(lines)]


def written_text(env_file: Any) -> str:
    """What applying a remedy whose lines only change a shell did: it wrote them to a file to source."""
    return f"written to {env_file}: source it in the launching shell"


def only_changes_the_shell(commands: Iterable[str]) -> bool:
    """Whether every line of a script only changes the shell it runs in (``export``, ``unset``, ``VAR=``):
    run by zdoctor, such a script changes nothing that outlives it."""
    lines = _command_lines(commands)
    return bool(lines) and all(_SHELL_ONLY.match(c) for c in lines)


def undo_label(commands: Iterable[str]) -> str:
    """The line above a remedy's undo (which is a script too: several lines stop at the first that fails)."""
    return f"Undo ({STOPS_NOTE})" if len(_command_lines(commands)) > 1 else "Undo"


def applied_heading(events: Iterable[Mapping[str, Any]]) -> str:
    """The export's heading over the remedy events: "What was applied" only when every one of them was an
    application (a declined, practised or copied fix was not applied)."""
    kinds = {str(ev.get("type")) for ev in events}
    return "What was applied" if kinds <= {"remedy_applied"} else "What was done with the fixes"


#: Above remedies that are the steps of one fix (each marked ``step``), not alternatives.
STEPS_HEADING = "Steps: do them in order (together they are the fix)"


def are_steps(remedies: Iterable[Any]) -> bool:
    """Whether several remedies are the ordered steps of one fix (every one marked ``step``)."""
    items = list(remedies)
    return len(items) > 1 and all(
        (r.get("step") if isinstance(r, Mapping) else getattr(r, "step", False)) for r in items)


def options_heading(n: int, steps: bool = False) -> str:
    """The heading above ``n`` remedies of one finding (alternatives, or the steps of one fix)."""
    if n <= 1:
        return ONE_OPTION_HEADING
    return STEPS_HEADING if steps else OPTIONS_HEADING


def is_recommended(remedy: Any) -> bool:
    """False for a remedy the node's present state does not support (``Remedy.recommended``)."""
    return remedy is None or _get(remedy, "recommended", True) is not False


def option_label(i: int, n: int, steps: bool = False, remedy: Any = None) -> str:
    """``Option 2``, or ``Option 1 (recommended)``, or ``Step 2`` of a fix in steps; a lone remedy is ``Fix``;
    a remedy the node's present state does not support is ``(not recommended)``, never the recommended one."""
    if not is_recommended(remedy):
        return ("Fix" if n <= 1 else f"Option {i}") + " (not recommended)"
    if n <= 1:
        return "Fix"
    if steps:
        return f"Step {i}"
    return f"Option {i}" + (" (recommended)" if i == 1 else "")


def _get(item: Any, key: str, default: Any = None) -> Any:
    return item.get(key, default) if isinstance(item, Mapping) else getattr(item, key, default)


def requires_of(remedy: Any) -> list[str]:
    """The findings whose fix must be done before ``remedy`` (their ids)."""
    said = _get(remedy, "requires")
    return [str(x) for x in said] if isinstance(said, list) else []


def first_line(required: Iterable[str], titles: Mapping[str, str] | None = None) -> str:
    """The ordered step before a remedy that depends on the fixes of other findings: what comes first."""
    titles = titles or {}
    parts = [f"the fix of “{titles[i]}” ({i})" if titles.get(i) else f"the fix of finding {i}" for i in required]
    return "First: " + " and ".join(parts) + "; then this one, which depends on it (not a choice between them)."


@dataclass
class FixGroup:
    """One finding's remedies on a screen that gathers several findings' fixes: its own alternatives (or
    steps), ``after`` the findings on the same screen whose fix comes first, ``also_for`` the findings whose
    identical remedy is listed here once."""

    finding: Any
    remedies: list[Any]
    after: list[str]
    also_for: list[Any]

    @property
    def steps(self) -> bool:
        return are_steps(self.remedies)

    @property
    def heading(self) -> str:
        return options_heading(len(self.remedies), self.steps)


def fix_groups(pairs: Iterable[tuple[Any, Any]]) -> list[FixGroup]:
    """``(finding, remedy)`` pairs grouped by finding: one finding's remedies are alternatives (or the steps
    of one fix), never mixed with another finding's; a remedy offered by several findings is listed once,
    under the first; a finding whose fix depends on another's (``requires``) comes after it."""
    groups: dict[str, FixGroup] = {}
    seen: dict[tuple[str, tuple[str, ...]], FixGroup] = {}
    for finding, remedy in pairs:
        fid = str(_get(finding, "id"))
        key = (str(_get(remedy, "title")), tuple(str(c) for c in _get(remedy, "commands") or []))
        if key in seen and seen[key] is not groups.get(fid):
            if all(_get(f, "id") != fid for f in seen[key].also_for):
                seen[key].also_for.append(finding)
            continue
        group = groups.setdefault(fid, FixGroup(finding, [], [], []))
        group.remedies.append(remedy)
        seen[key] = group
    listed = [g for g in groups.values() if g.remedies]
    for g in listed:
        g.after = [i for r in g.remedies for i in requires_of(r) if i in groups and i != _get(g.finding, "id")]
        g.after = list(dict.fromkeys(g.after))
    ordered: list[FixGroup] = []
    placing: set[str] = set()

    def place(g: FixGroup) -> None:
        fid = str(_get(g.finding, "id"))
        if g in ordered or fid in placing:
            return
        placing.add(fid)
        for dep in g.after:
            if groups[dep].remedies:
                place(groups[dep])
        ordered.append(g)

    for g in listed:
        place(g)
    return ordered


def recommendation(remedies: list[Any]) -> str:
    """Why the first of several remedies is recommended (empty for one or none)."""
    if remedies and not is_recommended(remedies[0]):
        return "None is recommended: the node's present state does not support them (each says why)."
    if len(remedies) < 2 or are_steps(remedies):
        return ""
    first = [verification_of(r) for r in remedies]
    if first[0].verified:
        return "Recommended because it was tried and fixed the failing command."
    if any(v.verified for v in first[1:]):  # pragma: no cover - makers sort tried-and-fixed first
        return "Recommended as listed by the check; another option was tried and fixed it."
    requires_root = [r.get("requires_root") if isinstance(r, Mapping) else getattr(r, "requires_root", False)
                     for r in remedies]
    if not requires_root[0] and any(requires_root[1:]):
        return "Recommended because it is the most direct change the evidence supports and needs no root."
    return "Recommended because it is the most direct change the evidence supports."


def tool_missing(tool: str, looked: Iterable[str]) -> str:
    """The one sentence for a tool a remedy's commands need that the node does not have."""
    return f"{tool} was not found on this node (looked: {'; '.join(looked)})"


def missing_tools(remedy: Any) -> list[str]:
    """What a remedy's commands need that the node lacks, each in the words of :func:`tool_missing`."""
    said = remedy.get("missing") if isinstance(remedy, Mapping) else getattr(remedy, "missing", None)
    return [str(s) for s in said] if isinstance(said, list) else []


def remedy_flags(remedy: Any, recorded_elsewhere: bool = False) -> list[str]:
    """The notes shown beside a remedy's title: its verification, ``needs root``, and every tool its commands
    need that the node does not have."""
    v = verification_of(remedy)
    flags = [verification_text(v, recorded_elsewhere)]
    if not is_recommended(remedy) and v.state == NOT_TRIED:
        flags = [f"not recommended, because {v.reason}", "not tried"]
    root = remedy.get("requires_root") if isinstance(remedy, Mapping) else getattr(remedy, "requires_root", False)
    if root and "root" not in flags[0]:
        flags.append("needs root")
    return flags + missing_tools(remedy)


# -- the symptom ledger -------------------------------------------------------------------------------
SYMPTOMS_HEADING = "What you saw"
#: The heading of the findings that explain none of the symptoms, after those that do (only when there
#: were symptoms; see :func:`zdoctor.core.verdicts.split_answers`).
ALSO_FOUND = "Also found on this node"
UNEXPLAINED_WORD = "UNEXPLAINED"
#: Before where a symptom's message is raised or logged in the installed code (no check confirmed it).
FROM_THE_SOURCE = "from the source only"
NO_SYMPTOMS = "no symptom given: no --command, --log or --symptom (nothing zdoctor could tie its findings to)"


def symptom_verdict(entry: Mapping[str, Any]) -> str:
    """``explained by libs.glibcxx`` or ``UNEXPLAINED`` (with the catalogue's word where it knows the line)."""
    by = [str(x) for x in entry.get("explained_by") or []]
    if by:
        return "explained by " + ", ".join(by)
    if entry.get("signature"):
        return f"{UNEXPLAINED_WORD} on this node (the message is known: {entry['signature']}, from the message only)"
    return UNEXPLAINED_WORD


def answer_line(entry: Mapping[str, Any]) -> str | None:
    """``the walk zero3-launch answers it: <its diagnosis> (<node>)`` when a walk answers the symptom (the
    entry's ``answered_by``), else None."""
    answer = entry.get("answered_by")
    if not isinstance(answer, Mapping) or not answer.get("playbook"):
        return None
    node = answer.get("diagnosis")
    end = f"{answer.get('diagnosis_title') or node} ({node})" if node else "no diagnosis"
    how = "" if answer.get("named_by_end") else f", met {answer.get('finding')} on its way"
    return f"the walk {answer['playbook']} answers it: {end}{how}"


def symptom_place(entry: Mapping[str, Any]) -> str:
    """Where a symptom was seen, in words."""

    src = str(entry.get("source") or "")
    return str(entry.get("where") or SOURCE_WORDS.get(src, src))


def unexplained_headline(entries: Iterable[Mapping[str, Any]]) -> str | None:
    """The summary's first sentence while a symptom stands unexplained, else None."""
    open_ones = [e for e in entries if not e.get("explained_by")]
    if not open_ones:
        return None
    n = len(open_ones)
    return (f"{n} symptom{'s' if n != 1 else ''} you saw {'are' if n != 1 else 'is'} not explained by any finding: "
            "no verdict below is the answer to it")


def scope_lines(examined: Iterable[str], not_examined: Iterable[str]) -> list[str]:
    """A healthy end's scope in two lines."""
    return [f"examined: {'; '.join(examined) or '-'}", f"not examined: {'; '.join(not_examined) or '-'}"]


def layer_lines(layers: Iterable[Mapping[str, Any]], verbose: bool = False) -> list[str]:
    """The layers of the node this run did not wholly examine: one line naming them, or (``verbose``) one
    line each with why. Empty when every layer was examined."""
    short = [layer for layer in layers if layer.get("status") != "examined"]
    if not short:
        return []
    if not verbose:
        names = [f"{layer.get('title')}{' (in part)' if layer.get('status') == 'partly examined' else ''}"
                 for layer in short]
        return [f"Layers not examined: {'; '.join(names)} (-v or --json says why)"]
    return [f"{layer.get('title')}: {layer.get('status')}: {layer.get('why') or '-'}" for layer in short]
