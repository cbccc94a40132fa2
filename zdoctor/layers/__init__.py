"""Checks turn probe facts into findings; evaluated with crash isolation."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from zdoctor.core.model import Evidence, Finding
from zdoctor.core.plural import noun_for
from zdoctor.core.registry import CHECKS, Facts, load_vocabulary
from zdoctor.host import Host
from zdoctor.host.replay import MALFORMED


def probe_findings(facts: Facts) -> list[Finding]:
    """A ``crash`` finding for every probe that crashed or ran past its budget."""
    out = []
    for name, res in facts.items():
        if res.status == "crash" and res.replayed and (res.error or "").startswith(MALFORMED):
            out.append(Finding(
                id=f"probe.{name}", status="warn", title=f"probe {name}: {MALFORMED.rstrip(': ')} (not used)",
                detail=(res.error or "")[len(MALFORMED):] + ". The checks that read it say \"not checked\"; "
                       "the recording is damaged or was edited."))
        elif res.status == "timeout":  # zdoctor's own budget, not a verdict on the node
            out.append(Finding(
                id=f"probe.{name}", status="skip", title=f"probe {name}: not examined: ran out of time",
                detail=(res.error or "") + ". The checks that read it say \"not checked\"; nothing is concluded "
                       "from its lateness.", evidence=list(res.evidence)))
        elif res.status == "crash":
            out.append(Finding(id=f"probe.{name}", status="crash", title=f"probe {name} crashed",
                               detail=res.error or "", evidence=list(res.evidence)))
    return out


#: Each check's findings for the probe results it last read: a check runs once per probe result, however
#: many nodes, edges and renderers ask (results are compared by identity; a new result runs it again).
_EVALUATED: dict[str, list[tuple[tuple[Any, ...], list[Finding]]]] = {}
_EVALUATED_LOCK = threading.Lock()
_KEEP = 8


def evaluate_check(name: str, facts: Facts) -> list[Finding]:
    """Check ``name``'s findings for ``facts``: computed once per set of probe results (see
    :func:`_evaluate`), a new list each call."""
    spec = CHECKS[name]
    key = (spec.func, *(facts.get(p) for p in spec.reads))
    with _EVALUATED_LOCK:
        for seen, found in _EVALUATED.get(name, []):
            if len(seen) == len(key) and all(a is b for a, b in zip(seen, key)):
                return list(found)
    found = _evaluate(name, facts)
    with _EVALUATED_LOCK:
        kept = _EVALUATED.setdefault(name, [])
        kept.insert(0, (key, found))
        del kept[_KEEP:]
    return list(found)


def _evaluate(name: str, facts: Facts) -> list[Finding]:
    """Run check ``name``; a check that raises becomes one ``crash`` finding with its traceback."""
    spec = CHECKS[name]
    broken = [p for p in spec.probes if p not in facts or facts[p].status in ("crash", "timeout")]
    if broken:
        return [spec.not_checked(f"needed {noun_for(len(broken), 'probe')} did not produce facts: "
                                 f"{', '.join(broken)}", sub="not-checked")]
    try:
        return _stamped(list(spec.func(facts)), facts, spec.reads)
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
        doubts = [d for p in spec.probes if p in facts for d in facts[p].doubtful]
        if doubts:  # recorded facts with a null where the probes never leave one: the input, not the check
            return [spec.not_checked(f"the recorded facts cannot be read ({type(exc).__name__}: {exc}): "
                                     f"{'; '.join(doubts)}; the recording is damaged or was edited", sub="not-checked")]
        recorded = [p for p in spec.reads if p in facts and facts[p].replayed]
        if recorded and isinstance(exc, (TypeError, AttributeError, KeyError, IndexError, ValueError)):
            # a recording holds a fact of another type than the probes write: the input, not the check
            return [spec.not_checked(f"the recorded facts of {', '.join(recorded)} cannot be read "
                                     f"({type(exc).__name__}: {exc}): a fact has another type than the probe writes; "
                                     "the recording is damaged or was edited", sub="not-checked")]
        return [Finding(id=f"{name}.crash", status="crash", title=f"check {name} crashed",
                        detail=f"{type(exc).__name__}: {exc}",
                        evidence=[Evidence(label=f"traceback of check {name}", kind="traceback",
                                           stdout=traceback.format_exc())])]


def probes_for(check_names: Iterable[str]) -> list[str]:
    """Every probe the named checks read, in a stable order."""
    out: list[str] = []
    for name in check_names:
        for p in CHECKS[name].reads:
            if p not in out:
                out.append(p)
    return out


def _stamped(found: list[Finding], facts: Facts, reads: Iterable[str]) -> list[Finding]:
    """The evidence a check built itself (a table of its verdict) dated when its facts were taken (the last
    of its probes' start), not when it ran: a replay then gives the very same findings as the run."""
    answered = [facts[p] for p in reads if p in facts]
    theirs = {id(e) for res in answered for e in res.evidence}
    when = max((res.started or 0.0 for res in answered), default=0.0)
    for f in found:
        if any(id(e) not in theirs for e in f.evidence):
            f.evidence = [e if id(e) in theirs else replace(e, started=when) for e in f.evidence]
    return found


def evaluate_checks(names: Iterable[str], facts: Facts) -> dict[str, list[Finding]]:
    """Each named check's findings, by check (see :func:`evaluate_check`)."""
    return {name: evaluate_check(name, facts) for name in names}


def run_checks(host: Host, names: Iterable[str] | None = None) -> tuple[Facts, list[Finding]]:
    """Probe concurrently for the named checks (default: all) and evaluate them."""
    load_vocabulary()
    names = list(CHECKS) if names is None else list(names)
    facts = host.results(probes_for(names))
    findings = probe_findings(facts)
    for found in evaluate_checks(names, facts).values():
        findings.extend(found)
    return facts, findings
