"""Check ``pyenv.deepspeed-launch-bug``: the known launcher bugs of the installed DeepSpeed release
(zdoctor/layers/python_env/dsbugs.py), whether the launch's own arguments and environment set each off, and
the message each one prints."""

from __future__ import annotations

import shlex
from typing import Any, Mapping

from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.python_env import dsbugs
from zdoctor.symptoms.match import ids_for

CID = "pyenv.deepspeed-launch-bug"
#: The symptom kind of the catalogue's entries for these bugs (each with its ``bug`` field).
KIND = "ds-launcher-bug"


def upgrade_remedy(bug: dict[str, Any], python: str | None) -> Remedy:
    """The fixed release, installed with the training environment's own interpreter."""
    want = "deepspeed>=" + bug["first_fixed"]
    return Remedy(title=f"Upgrade DeepSpeed to {bug['first_fixed']} or newer, the first release with the fix",
                  commands=[f"{shlex.quote(python or 'python')} -m pip install --upgrade {shlex.quote(want)}"],
                  note="not tried, because it replaces the installed DeepSpeed",
                  explanation=f"Fixed by {bug['fixed_by']}.")


def workaround_remedy(bug: dict[str, Any], launch: Mapping[str, Any]) -> Remedy:
    """The documented way around the bug on the installed release."""
    if bug["id"] == "pdsh-ssh-port-keyerror":
        command = launch.get("command") or "deepspeed ..."
        return Remedy(title="Or set PDSH_SSH_ARGS_APPEND (empty is enough) for the launch",
                      commands=[f"export PDSH_SSH_ARGS_APPEND={shlex.quote('')}", command],
                      note="not tried, because trying it starts the training",
                      explanation="The affected release appends ' -p PORT' to the variable with +=; set, it is "
                                  "appended to instead of raising KeyError.")
    return Remedy(title=f"Or, on this release: {bug['workaround']}", note="not tried, because it changes the job")


def _hosts(facts: Facts) -> int | None:
    hf = facts.of("hostfile")
    if not hf or hf.get("skipped") or hf.get("error"):
        return None
    return len(hf.get("nodes") or [])


def _one(me: CheckSpec, bug: dict[str, Any], rec: dict[str, Any], facts: Facts, version: str,
         python: str | None, ev: list[Evidence]) -> Finding | None:
    bid = bug["id"]
    seen = ids_for(facts, KIND, bug=bid)
    launch_facts = facts.of("launch") or {}
    launch = launch_facts.get("launch") or {}
    where = f"{rec.get('file') or '?'}, {rec.get('how') or '-'}"
    era = rec.get("era")
    if era and rec.get("how") == "read from the installed file" and (era == "affected") != (rec["state"] == "affected"):
        where += (f"; its release number says {era} by the tags, so its files were changed or mixed after the "
                  "install: the files decide")
    span = f"releases {bug['first_bad']} up to {bug['first_fixed']} (not included)"
    if bug.get("not_affected_between"):
        span += " but for {} up to {}".format(*bug["not_affected_between"])
    if rec.get("state") == "affected":
        exports = (facts.of("dsrelease") or {}).get("exports")
        fires, why = dsbugs.launch_sets_off(bid, rec, launch, launch_facts.get("env") or {}, _hosts(facts),
                                            exports)
        detail = (f"DeepSpeed {version} ({where}) has this bug of {span}: {bug['affected']}. "
                  f"This launch: {why}. Sources: {'; '.join(bug['sources'])}.")
        remedies = [upgrade_remedy(bug, python), workaround_remedy(bug, launch)]
        if bid == "pdsh-export-unquoted" and fires and any(e.get("launch_dir") for e in exports or []):
            detail += (" The launch directory itself holds such characters, and every release read (0.19.8 "
                       "too) writes it unquoted into the remote command's 'cd DIR;': upgrading alone does not "
                       "get past it.")
            remedies = [Remedy(title="Launch from a directory whose path has no shell syntax characters",
                               note="not tried, because it moves the job",
                               explanation="The launcher exports PYTHONPATH with the launch directory in front "
                                           "and runs 'cd DIR' on every node, both unquoted."), *remedies]
        if fires or seen:
            return me.finding(status="fail", sub=bid,
                              title=f"DeepSpeed {version}'s launcher bug stops this launch: {bug['message']}",
                              detail=detail, evidence=ev, remedies=remedies, explains=seen)
        if fires is None:
            return me.finding(status="warn", sub=bid,
                              title=f"DeepSpeed {version} has a launcher bug ({bug['about']}); whether this "
                                    "launch sets it off is not known",
                              detail=detail, evidence=ev, remedies=remedies)
        return me.finding(status="ok", sub=bid,
                          title=f"DeepSpeed {version} has a launcher bug this launch does not set off "
                                f"({bug['about']})", detail=detail, evidence=ev)
    if not seen:
        return None
    if rec.get("state") == "not-affected":
        others = bug.get("others_print_it")
        return me.finding(
            status="warn", sub=bid,
            title=f"'{bug['message']}' is the launcher bug of DeepSpeed {span}, but the installed {version} "
                  "has the fix: " + ("if the deepspeed launcher printed it, another install did" if others
                                     else "the launcher that printed it is another install"),
            detail=f"The installed release ({where}) does not have the bug. "
                   + (f"The message is also {others}'s: read the lines before it for what printed it. " if others
                      else "") +
                   "From a deepspeed launcher it comes from an affected release: another environment's `deepspeed` "
                   f"earlier on PATH, or a node of the job with an older install. "
                   f"Sources: {'; '.join(bug['sources'])}.",
            evidence=ev, explains=seen,
            remedies=[Remedy(title="Launch with the training environment's own launcher",
                             commands=[f"{shlex.quote(python or 'python')} -m deepspeed.launcher.runner ..."],
                             note="not tried, because trying it starts the training",
                             explanation="`command -v deepspeed` on each node names the launcher that runs.")])
    return me.finding(
        status="warn", sub=bid,
        title=f"'{bug['message']}': the launcher bug of DeepSpeed {span} (from the message only)",
        detail=f"The installed release could not be read ({rec.get('why') or 'unknown'}). {bug['affected']}. "
               "Read next: the DeepSpeed release of the environment the launcher runs from "
               f"(`python -m pip show deepspeed`). Sources: {'; '.join(bug['sources'])}.",
        evidence=ev, explains=seen, remedies=[upgrade_remedy(bug, python)])


@check(CID, title="Known launcher bugs of the installed DeepSpeed release", probes=("dsrelease",),
       optional=("launch", "hostfile"), explains=(KIND,), layer="python-env",
       findings=tuple(f"{CID}.{b['id']}" for b in dsbugs.BUGS))
def check_launch_bugs(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("dsrelease"), facts.why_not("dsrelease"))
    if not f.get("installed"):
        return [me.finding(status="skip", title="Known DeepSpeed launcher bugs: DeepSpeed not installed",
                           detail="No DeepSpeed in the training environment.")]
    bugs = f.get("bugs") or {}
    if not bugs:
        return [me.not_checked("the dsrelease probe read no launcher bug rules")]
    ev = facts.evidence("dsrelease")
    version = f.get("version") or "?"
    out = [x for x in (_one(me, b, bugs.get(b["id"]) or {"state": "unknown"}, facts, version, f.get("python"), ev)
                       for b in dsbugs.BUGS) if x is not None]
    unknown = [bid for bid, r in bugs.items() if r.get("state") == "unknown"]
    clear = [bid for bid, r in bugs.items() if r.get("state") == "not-affected"]
    if not out:
        out.append(me.finding(
            status="ok" if not unknown else "skip",
            title=f"DeepSpeed {version}: none of the known launcher bugs"
                  + (f" ({len(unknown)} not read)" if unknown else ""),
            detail="\n".join(f"{bid}: {r['state']} ({r.get('how') or r.get('why') or '-'})"
                             for bid, r in bugs.items()) + (f"\nNot affected: {', '.join(clear)}." if clear else ""),
            evidence=ev))
    return out
