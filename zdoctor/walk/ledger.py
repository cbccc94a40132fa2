"""The symptom ledger: each symptom with the findings that explain it, or shown as unexplained.

A symptom is explained by a finding that states a problem (fail, warn or crash: an ``ok`` never explains a
failure) and either names it or comes from a check its catalogue entry names as confirming it (see
:mod:`zdoctor.symptoms.links`). A symptom nothing explains becomes a failing
``symptom.unexplained.<id>`` finding that quotes it, says what zdoctor examined and what it did not, and,
where the catalogue knows the message, names the likely cause "from the message only".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from zdoctor.core.model import Evidence, Finding
from zdoctor.core.nodelayers import BY_ID
from zdoctor.core.plural import noun_for
from zdoctor.core.registry import CHECKS, Facts, load_vocabulary
from zdoctor.core.symptom import SOURCE_WORDS, UNEXPLAINED_PREFIX, Symptom
from zdoctor.layers import evaluate_check, probes_for
from zdoctor.symptoms.catalogue import signature
from zdoctor.symptoms.links import Said, candidate_checks, derive
from zdoctor.symptoms.match import symptoms_of


@dataclass
class Entry:
    """One symptom and the ids of the findings that explain it."""

    symptom: Symptom
    explained_by: list[str]

    @property
    def explained(self) -> bool:
        return bool(self.explained_by)

    def to_dict(self) -> dict[str, Any]:
        """The entry as the report and the exports show it (the shape
        :func:`zdoctor.symptoms.view.ledger_entries` gives)."""
        s = self.symptom
        out = {"id": s.id, "source": s.source, "where": s.where, "text": s.text, "kind": s.kind,
               "signature": s.signature, "explained_by": list(self.explained_by)}
        if s.fields.get("origin_text"):
            out["origin"] = s.fields["origin_text"]
        return out


def build(symptoms: Iterable[Symptom], findings: Iterable[Finding]) -> list[Entry]:
    """Join symptoms with the findings that explain them (:func:`zdoctor.symptoms.links.derive`)."""
    listed = list(symptoms)
    links = derive(listed, [Said(f.id, f.status, tuple(f.explains)) for f in findings])
    return [Entry(s, links[s.id]) for s in listed]


def linked(findings: Iterable[Finding], entries: Iterable[Entry]) -> list[Finding]:
    """``findings`` with each one's ``explains`` naming every symptom the ledger says it explains (a copy
    where a derived link adds one), so a finding and the ledger never disagree."""
    adds: dict[str, list[str]] = {}
    for e in entries:
        for fid in e.explained_by:
            adds.setdefault(fid, []).append(e.symptom.id)
    out = []
    for f in findings:
        more = [sid for sid in adds.get(f.id, []) if sid not in f.explains]
        out.append(replace(f, explains=[*f.explains, *more]) if more else f)
    return out


def scope(symptom: Symptom, findings: Iterable[Finding]) -> tuple[list[str], list[str]]:
    """(what was examined, what was not) for ``symptom``: the checks that can explain it, each with what it
    concluded; a check that could not look is "not examined" with its reason."""
    load_vocabulary()
    by_check: dict[str, list[Finding]] = {}
    for f in findings:
        for name in CHECKS:
            if f.id == name or f.id.startswith(name + "."):
                by_check.setdefault(name, []).append(f)
                break
    examined, not_examined = [], []
    for name in candidate_checks(symptom):
        spec = CHECKS[name]
        found = by_check.get(name, [])
        if not found:
            not_examined.append(f"{spec.title} (did not run)")
        elif all(f.status == "skip" for f in found):
            not_examined.append(f"{spec.title}: {found[0].detail or found[0].title}")
        else:
            examined.append(f"{spec.title}: {'; '.join(f.title for f in found if f.status != 'skip')}")
    return examined, not_examined


def config_values(keys: str, facts: Any) -> list[str]:
    """Each config key (comma-separated ``keys``) as the job's ds_config sets it, where the ``dsconfig``
    probe read it (``zero_optimization.offload_param.buffer_count = 4 (set)``)."""
    of = getattr(facts, "of", None)
    settings = ((of("dsconfig") if callable(of) else None) or {}).get("settings")
    out: list[str] = []
    for key in [k for k in keys.split(",") if k]:
        for block in (settings or {}).values() if isinstance(settings, dict) else ():
            row = block.get(key) if isinstance(block, dict) else None
            if isinstance(row, dict) and "value" in row:
                out.append(f"{row.get('key') or key} = {row.get('value')!r} ({row.get('source') or 'set'})")
    return out


def from_the_source(s: Symptom, facts: Any = None) -> list[str]:
    """What the installed code says of the message: where it is raised or logged, and what it reads."""
    f = s.fields
    if not f.get("origin_text"):
        return []
    lines = ["", f"From the source only, not confirmed by a check on this node: {f['origin_text']}."]
    if f.get("config_keys"):
        values = config_values(f["config_keys"], facts)
        keys = [k.strip() for k in str(f["config_keys"]).split(",") if k.strip()]
        lines.append(f"It reads the config {noun_for(len(keys), 'key')} {', '.join(keys)}"
                     + (f"; this job's ds_config: {'; '.join(values)}." if values else "."))
    if f.get("env_values"):
        lines.append(f"It reads the environment: {f['env_values']} (in the job's environment).")
    return lines


def unexplained_finding(entry: Entry, findings: list[Finding], facts: Any = None) -> Finding:
    """The failing finding that stands for one unexplained symptom (located in the installed code where the
    ``origins`` probe found its message: "from the source only")."""
    s = entry.symptom
    sig = signature(s.signature)
    examined, not_examined = scope(s, findings)
    if sig is not None and not sig.confirm:
        layer = BY_ID[sig.layer]
        not_examined.append(f"{layer.title} ({layer.id}): no check of zdoctor confirms this message on this node")
    if not examined and not not_examined:
        not_examined.append("no check of zdoctor recognises this message")
    lines = [f"Seen in {SOURCE_WORDS.get(s.source, s.source)}{f' ({s.where})' if s.where else ''}:", f"  {s.text}"]
    if sig is not None:
        lines += ["", f"Likely cause, from the message only, not confirmed on this node: {sig.meaning}.",
                  f"Read next: {sig.read_next}."]
    lines += from_the_source(s, facts)
    lines += ["", "Examined: " + ("; ".join(examined) if examined else "nothing that can explain it"),
              "Not examined: " + ("; ".join(not_examined) if not_examined else "-")]
    rows = [["examined", x] for x in examined] + [["not examined", x] for x in not_examined]
    evidence = [Evidence.of_table(f"what zdoctor looked at for {s.id}", ["", "check"], rows)] if rows else []
    if sig is not None:
        evidence.append(Evidence.note(f"catalogue entry {sig.id}", f"{sig.meaning}\n\nsource of the message: "
                                      + "; ".join(sig.sources)))
    title = f'Unexplained: "{s.text}"'
    if sig is not None:
        title += " (likely cause from the message only)"
    elif s.fields.get("origin"):
        title += f" (located in the source only: {s.fields['origin']})"
    if s.fields.get("origin_text"):
        evidence.append(Evidence.note(f"where {s.id} comes from", "\n".join(from_the_source(s, facts)[1:])))
    return Finding(id=f"{UNEXPLAINED_PREFIX}{s.id}", status="fail", title=title, detail="\n".join(lines),
                   evidence=evidence, explains=[])


#: Id prefix of the finding that says a file the user gave with what they saw could not be read.
UNREAD_PREFIX = "symptom.unread."


def unread_findings(facts: Facts) -> list[Finding]:
    """A failing finding for each file the user gave with what they saw that could not be read: its lines
    were never examined, so no end may call the node healthy over them."""
    of = getattr(facts, "of", None)
    found = of("symptoms") if callable(of) else None
    unread = [str(u) for u in (found or {}).get("unread") or [] if str(u).startswith("the --log file")]
    return [Finding(id=f"{UNREAD_PREFIX}{n}", status="fail", title=f"Not read: {u}",
                    detail="What this file holds was not examined: no line of it is among the symptoms, and nothing "
                           "here is a verdict on it. Give it as a regular file zdoctor may read.")
            for n, u in enumerate(unread, 1)]


def assess(facts: Facts, findings: list[Finding]) -> tuple[list[Entry], list[Finding]]:
    """The ledger for ``facts`` and every finding; one failing finding per unexplained symptom and per file
    of what the user saw that could not be read."""
    entries = build(symptoms_of(facts), findings)
    unexplained = [unexplained_finding(e, findings, facts) for e in entries if not e.explained]
    return entries, unexplained + unread_findings(facts)


def ledger_on(host: Any) -> list[Entry]:
    """The ledger of ``host``: the checks able to explain each symptom's kind are evaluated (their probes
    run, once per host)."""
    symptoms = symptoms_of(host.results(["symptoms", "origins"]))
    if not symptoms:
        return []
    names = list(dict.fromkeys(name for s in symptoms for name in candidate_checks(s)))
    facts = host.results(probes_for(names)) if names else Facts({})
    return build(symptoms, [f for name in names for f in evaluate_check(name, facts)])


def unexplained_on(host: Any) -> list[Entry]:
    """The symptoms on ``host`` that no finding explains."""
    return [e for e in ledger_on(host) if not e.explained]
