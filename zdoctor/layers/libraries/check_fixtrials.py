"""Check ``libs.fix-trials``: the verifying re-run of the failing command, once with each candidate fix.

The ``libfix`` probe re-runs the failing command with each environment-only fix applied to a copy of the
environment; this check states what those re-runs showed, so the step that verifies the hypothesis shows
its own evidence (the re-run's result) rather than only the findings that led to it.
"""

from __future__ import annotations

import shlex
from typing import Any

from zdoctor.core.model import Evidence, Finding
from zdoctor.core.plural import count_of
from zdoctor.core.present import verification_mark, verification_of, verification_text
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.trials.remedies import Plan

FID = "libs.fix-trials"
TITLE = "The failing command, re-run with each fix"


def _change(plan: Plan) -> str:
    """``unset LD_LIBRARY_PATH``, ``LD_PRELOAD=/lib/...``: the environment change a plan makes."""
    parts = [f"unset {k}" if v is None else f"{k}={v}" for k, v in plan.env_changes.items()]
    return "; ".join(parts) or "; ".join(plan.commands) or "-"


@check(FID, title=TITLE, probes=("libfix",))
def check_fix_trials(facts: Facts, me: CheckSpec) -> list[Finding]:
    fix = me.require(facts.of("libfix"), facts.why_not("libfix"))
    plans = [Plan.from_dict(p) for p in fix.get("plans") or []]
    if not plans:
        why = ("the command did not fail for want of a libstdc++ version, so there was nothing to try"
               if not fix.get("needed") else "no fix could be proposed from the evidence")
        return [me.not_checked(why)]
    argv: list[Any] = list(fix.get("argv") or [])
    command = argv[-1] if argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3 else shlex.join(map(str, argv))
    rows, lines = [], [f"Re-ran: {command}" if command else "Re-ran the failing command"]
    for plan in plans:
        v = verification_of(plan.to_remedy())
        rows.append([plan.title, _change(plan), verification_text(v)])
        lines.append(f"{verification_mark(v)[0]} {plan.title}: {verification_text(v)}")
    tried = [p for p in plans if p.tried]
    fixed = [p for p in plans if p.verified and p.tried]
    table = Evidence.of_table("the failing command re-run with each fix", ["fix", "change", "re-run"], rows)
    res = facts.get("libfix")
    reruns = [e for e in (res.evidence if res is not None else []) if e.kind == "command"]
    evidence = [table, *reruns]
    if fixed:
        return [me.finding(status="ok",
                           title=f"Hypothesis confirmed: the command succeeds with {len(fixed)} of "
                                 f"{count_of(len(plans), 'fix', 'fixes')} (re-run with each)",
                           detail="\n".join(lines), evidence=evidence)]
    if tried:
        return [me.finding(status="warn",
                           title=f"No fix tried made the command succeed ({len(tried)} of "
                                 f"{count_of(len(plans), 'fix', 'fixes')} tried)",
                           detail="\n".join(lines), evidence=evidence)]
    return [me.finding(status="skip", title=f"{TITLE}: not tried", detail="\n".join(lines), evidence=evidence)]
