"""Check ``pyenv.special-files``: a FIFO, device, socket or looping link where the training's libraries, JIT
ops or shell start-up files are read, named as what it is, with what it does to a launch."""

from __future__ import annotations

from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.python_env.specialfiles import effect, removal

CID = "pyenv.special-files"
TITLE = "Special files where libraries, ops and start-up files are read"


@check(CID, title=TITLE, probes=("special_files",))
def check_special_files(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("special_files"), facts.why_not("special_files"))
    ev = facts.evidence("special_files")
    found = [x for x in f.get("found") or [] if isinstance(x, dict) and x.get("path")]
    looked = "; ".join(str(x) for x in f.get("looked") or [])
    if not found:
        return [me.finding(status="ok", title="No FIFO, device or looping link among the files looked at",
                           detail=f"Looked at (without opening anything): {looked}.", evidence=ev)]
    rows = [[str(x["path"]), str(x.get("kind")), str(x.get("where")), effect(x)] for x in found]
    table = Evidence.of_table("special files", ["path", "is", "where", "what it does"], rows)
    first = found[0]
    title = (f"{first['path']} is {first.get('kind')} {first.get('where')}" if len(found) == 1 else
             f"{count_of(len(found), 'special file')} where libraries, ops and start-up files are read "
             f"(first: {first['path']}, {first.get('kind')})")
    lines = [f"- {r[0]}: {r[1]}, {r[2]}: {r[3]}." for r in rows]
    if f.get("truncated"):
        lines.append("- ... and possibly more (the list stops at the first 50).")
    remedy = Remedy(title=f"Remove {'it' if len(found) == 1 else 'them'} (each only while it is still of its kind)",
                    commands=[removal(x) for x in found],
                    explanation="Each line removes the file only if it is still the FIFO, device or link that was "
                                "found (a regular file put there since is left alone). A library the loader "
                                "should find there must then be put back as a regular file.",
                    note="it removes files, which zdoctor does not do on its own")
    return [me.finding(status="fail", title=title,
                       detail="\n".join(["Found without opening them:", *lines, "", f"Looked at: {looked}."]),
                       evidence=[table, *ev], remedies=[remedy])]
