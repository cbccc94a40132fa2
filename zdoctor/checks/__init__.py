"""Checks turn probe facts into findings; evaluated with crash isolation."""

from __future__ import annotations

import traceback
from collections.abc import Iterable

from ..host import Host
from ..model import Evidence, Finding
from ..registry import CHECKS, Facts, load_vocabulary


def probe_findings(facts: Facts) -> list[Finding]:
    """A ``crash`` finding for every probe that crashed or ran past its budget."""
    out = []
    for name, res in facts.items():
        if res.status in ("crash", "timeout"):
            out.append(Finding(
                id=f"probe.{name}", status="crash",
                title=f"probe {name} {'crashed' if res.status == 'crash' else 'timed out'}",
                detail=res.error or "", evidence=list(res.evidence)))
    return out


def evaluate_check(name: str, facts: Facts) -> list[Finding]:
    """Run check ``name``; a check that raises becomes one ``crash`` finding with its traceback."""
    spec = CHECKS[name]
    broken = [p for p in spec.probes if p not in facts or facts[p].status in ("crash", "timeout")]
    if broken:
        return [Finding(id=f"{name}.not-checked", status="skip", title=f"{spec.title}: not checked",
                        detail=f"needed probe(s) did not produce facts: {', '.join(broken)}")]
    try:
        return list(spec.func(facts))
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
        return [Finding(id=f"{name}.crash", status="crash", title=f"check {name} crashed",
                        detail=f"{type(exc).__name__}: {exc}",
                        evidence=[Evidence(label=f"traceback of check {name}", kind="traceback",
                                           stdout=traceback.format_exc())])]


def probes_for(check_names: Iterable[str]) -> list[str]:
    """Every probe the named checks read, in a stable order."""
    out: list[str] = []
    for name in check_names:
        for p in CHECKS[name].probes:
            if p not in out:
                out.append(p)
    return out


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
