"""Check ``pyenv.deepspeed-release``: the behaviour of the installed DeepSpeed release where it differs from
current releases, and JIT ops built by another DeepSpeed install."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import DsreleaseFacts
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.packages import managers, package_name
from zdoctor.core.plural import count_of, noun_for
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.python_env import dsrules as dsr


def _sources(rule_id: str) -> str:
    return "; ".join(dsr.RULES_BY_ID[rule_id]["sources"])


def libaio_remedies_for_dpkg_only(distro: Mapping[str, Any]) -> tuple[list[Remedy], list[str]]:
    """For a release whose async_io asks dpkg alone: install libaio's headers and library, one alternative
    per package manager this node may have, and the lines that say which are not offered and why. Such a
    release never sees an rpm package: there DeepSpeed is upgraded to the first release with the link test
    first, as a step."""
    rule = dsr.RULES_BY_ID["libaio-detection"]
    remedies: list[Remedy] = []
    withheld: list[str] = []
    for pm in managers(distro):
        package = package_name("libaio headers", pm.family)
        if pm.family != "apt":
            withheld.append(
                f"Not offered: installing {package} alone ({pm.label}), because this DeepSpeed release only checks "
                f"dpkg (op_builder/async_io.py: dpkg -l libaio-dev), so async_io stays incompatible after it: "
                f"{rule['old_consequence']} (sources: {_sources('libaio-detection')}).")
            remedies.append(Remedy(
                title=f"Upgrade DeepSpeed to {rule['first_current']} or newer, which link-tests libaio, and install "
                      f"{package} ({pm.label})",
                commands=[f"python -m pip install --upgrade {shlex.quote('deepspeed>=' + rule['first_current'])}",
                          *pm.install(package)],
                requires_root=True, note="not tried: it replaces DeepSpeed and installs a package"))
            continue
        remedies.append(Remedy(title=f"Install the libaio headers and library ({pm.label})",
                               commands=pm.install(package), requires_root=True))
    return remedies, withheld


def _rule_findings(me: CheckSpec, facts: DsreleaseFacts, ev: list[Evidence], distro: Mapping[str, Any]
                   ) -> list[Finding]:
    out: list[Finding] = []
    rules = facts.get("rules") or {}
    ver = facts.get("version") or "?"
    aio = rules.get("libaio-detection") or {}
    if aio.get("state") == "old":
        rule = dsr.RULES_BY_ID["libaio-detection"]
        aio_remedies, withheld = libaio_remedies_for_dpkg_only(distro)
        out.append(Finding(
            id=me.id("libaio-dpkg"), status="warn",
            title=f"DeepSpeed {ver} decides async_io's libaio by dpkg alone: ds_report's async_io verdict is "
                  "not evidence",
            detail=f"This release ({aio.get('file')}): {rule['old']}. Current releases: {rule['current']}. "
                   f"Sources: {_sources('libaio-detection')}. Trust the storage checks' link test of libaio "
                   "instead of ds_report's column." + "".join("\n" + line for line in withheld),
            evidence=ev,
            remedies=[*aio_remedies,
                      Remedy(title=f"Or upgrade DeepSpeed to a release that link-tests libaio "
                                   f"({rule['first_current']} or newer)",
                             commands=[f"python -m pip install --upgrade "
                                       f"{shlex.quote('deepspeed>=' + rule['first_current'])}"])]))
    pin = rules.get("zero12-pin-memory") or {}
    if pin.get("state") == "old":
        rule = dsr.RULES_BY_ID["zero12-pin-memory"]
        out.append(Finding(
            id=me.id("pin-memory-ignored"), status="warn",
            title=f"DeepSpeed {ver} ignores offload_optimizer.pin_memory at ZeRO stage 1/2",
            detail=f"{pin.get('file')} never reads it: {rule['old']}. Current releases: {rule['current']}. "
                   f"Source: {_sources('zero12-pin-memory')}. Setting pin_memory to fix a memlock or RAM "
                   "problem does nothing on this release; the remedy is the memlock limit or a newer DeepSpeed.",
            evidence=ev))
    timers = rules.get("wall-clock-timer-names") or {}
    if timers.get("state") == "old":
        out.append(Finding(
            id=me.id("timer-names"), status="ok",
            title=f"DeepSpeed {ver} prints the older wall_clock_breakdown timer names (forward_microstep, ...)",
            detail="zdoctor reads both the older names and the current ones (fwd_microstep, ...). "
                   f"Source: {_sources('wall-clock-timer-names')}.", evidence=ev))
    return out


def _own_cache(loc: str | None) -> str:
    """A cache dir of the environment's own: beside its site-packages (``<prefix>/torch_extensions``)."""
    if not loc:
        return '"$VIRTUAL_ENV/torch_extensions"'
    parts = loc.rstrip("/").split("/")
    prefix = "/".join(parts[:-4]) if len(parts) > 4 and parts[-2] == "site-packages" else os.path.dirname(loc)
    return shlex.quote(os.path.join(prefix or "/", "torch_extensions"))


def _origin_findings(me: CheckSpec, facts: DsreleaseFacts, ev: list[Evidence]) -> list[Finding]:
    out = []
    loc = facts.get("location")
    ver = facts.get("version") or "?"
    for o in facts.get("jit_origins") or []:
        if o.get("in_use") is False:
            continue
        other = o.get("same_install") is False
        stale = bool(o.get("newer_sources"))
        if not (other or stale):
            continue
        op_dir = o["dir"]
        if other:
            title = (f"JIT op {o['op']} was built by another DeepSpeed install ({o['deepspeed_dir']}, "
                     f"{o.get('version') or 'version unknown'}), not the training's ({loc}, {ver})")
            why = ("Two environments share this extension cache: each launch recompiles the op for its own "
                   "DeepSpeed (or, while the other's build holds the lock, waits), and a half-finished build "
                   "from one leaves a .so the other cannot load ('undefined symbol').")
        else:
            title = (f"JIT op {o['op']} is older than its sources: built before DeepSpeed at {o['deepspeed_dir']} "
                     f"last changed (now {o.get('version') or 'version unknown'})")
            newer = len(o["newer_sources"])
            why = (f"{count_of(newer, 'source file')} {noun_for(newer, 'is', 'are')} newer than the .so "
                   f"({', '.join(o['newer_sources'][:3])}): DeepSpeed was upgraded or reinstalled at this path after "
                   "the op was built. torch's next load rebuilds it (ninja compares the times); until then, and "
                   "wherever a process loads the .so directly, the old build is what runs.")
        out.append(Finding(
            id=me.id("jit-op-other-release"), status="warn", title=title,
            detail=why + " build.ninja in the op dir records the sources it was compiled from.",
            evidence=ev,
            remedies=[Remedy(title="Give this environment its own extension cache (DeepSpeed's advice for "
                                   "several environments)",
                             commands=[f"export TORCH_EXTENSIONS_DIR={_own_cache(loc)}"]),
                      Remedy(title=f"Or remove the op dir so that the next launch rebuilds {o['op']} from the "
                                   "installed DeepSpeed (no training may be running)",
                             commands=[f"rm -rf -- {shlex.quote(op_dir)}"])]))
    return out


@check("pyenv.deepspeed-release", title="Rules of the installed DeepSpeed release",
       probes=("dsrelease", "toolchain"),
       findings=("pyenv.deepspeed-release.jit-op-other-release", "pyenv.deepspeed-release.libaio-dpkg",
                 "pyenv.deepspeed-release.pin-memory-ignored", "pyenv.deepspeed-release.timer-names"))
def check_release(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("dsrelease"), facts.why_not("dsrelease"))
    if not f.get("installed"):
        return [me.finding(status="skip",
                           title="DeepSpeed release rules: DeepSpeed not installed",
                           detail="No DeepSpeed in the training environment.")]
    ev = facts.evidence("dsrelease")
    out = _rule_findings(me, f, ev, (facts.of("toolchain") or {}).get("distro") or {}) + _origin_findings(me, f, ev)
    unknown = [rid for rid, r in (f.get("rules") or {}).items() if r.get("state") == "unknown"]
    summary = me.finding(
        status="ok" if not unknown else "skip",
        title=f"DeepSpeed {f.get('version') or '?'}: release-specific rules read"
              + (f" ({len(unknown)} unknown)" if unknown else ""),
        detail="\n".join(f"{rid}: {r['state']} ({r.get('how') or r.get('why') or '-'})"
                         for rid, r in (f.get("rules") or {}).items()),
        evidence=ev)
    return [summary, *out]


def nvcc_rule_of_installed(facts: Facts) -> dict[str, Any] | None:
    """The nvcc rule of the installed release (state, table, skip_env), or None when not read."""
    rules = (facts.of("dsrelease") or {}).get("rules") or {}
    rec = rules.get("nvcc-minor-tolerance")
    return rec if rec and rec.get("state") in ("old", "current") else None
