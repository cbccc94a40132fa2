"""Probe ``kernel_log``: the kernel log's NVIDIA Xid and NVRM records, PCIe AER errors and OOM kills.

It reads ``/dev/kmsg`` non-blocking (bounded); where that is refused (``kernel.dmesg_restrict`` for a user
without CAP_SYSLOG) ``journalctl -k -o json`` of this boot (bounded, with a time limit); where both fail the
log is not examined, and the facts say why (``skipped``, ``attempts``). Facts: ``source`` (kmsg | journalctl),
``path``, ``window`` {since, until, boot_time} (seconds since the epoch: a record's microseconds since boot
plus /proc/stat's btime), ``records_read``, ``truncated``, ``overwritten``, and the kernel's own records found
(see :func:`zdoctor.layers.kernel_log.kernlog.classify`): ``xids``, ``api_mismatch``, ``aer``, ``ooms``,
judged in :mod:`zdoctor.layers.kernel_log.check_kernlog`; and ``user_space``: records that read like those but
are not the kernel's (written from user space, or the driver's words not at the start), shown with why, never
judged. A log that gave no record of the kernel's facility is not examined.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import time
from typing import Any

from zdoctor.core.factstypes import KernelLogFacts
from zdoctor.core.model import Evidence
from zdoctor.core.plural import count_of
from zdoctor.core.registry import probe
from zdoctor.layers.kernel_log import kernlog
from zdoctor.proc.runner import run, which_all
from zdoctor.readers.pcipresent import PCI_DEVICES, pci_device

JOURNAL_TIMEOUT = 20.0
JOURNAL_LINES = 20_000
#: journalctl's words when it shows only what the user may read, not the system's (kernel) journal.
_JOURNAL_PARTIAL = ("not seeing messages from other users and the system", "insufficient permissions")


def _restrict_note(error: str, code: int | None, sysctl: str = "/proc/sys/kernel/dmesg_restrict") -> str:
    """``error``, with why when the kernel refused the read for this user (EPERM under dmesg_restrict)."""
    if code != errno.EPERM:
        return error
    try:
        with open(sysctl, encoding="ascii") as fh:
            value = fh.read(8).strip()
    except OSError:
        return error
    if value == "1":
        return f"{error} (kernel.dmesg_restrict=1: only a user with CAP_SYSLOG, such as root, may read it)"
    return error


def read_journal(since: float | None = None, *, path: str | None = None, timeout: float = JOURNAL_TIMEOUT,
                 lines: int = JOURNAL_LINES) -> tuple[kernlog.Read, Evidence | None]:
    """This boot's kernel records from journald (``journalctl -k -o json``), the newest ``lines``."""
    found = [path] if path else which_all("journalctl", "/usr/bin:/bin:/usr/sbin:/sbin")
    if not found:
        return kernlog.Read(error="journalctl is not installed"), None
    argv = [found[0], "-k", "-o", "json", "--no-pager", "-q", "-n", str(lines)]
    if since is not None:
        argv += ["--since", f"@{int(since)}"]
    ev = run(argv, timeout=timeout, cap=64 * 1024 * 1024, label="journalctl -k -o json")
    if ev.error or ev.exit_code != 0:
        why = ev.error or f"exit code {ev.exit_code}: {(ev.stderr or '').strip()[:300] or 'no message'}"
        return kernlog.Read(error=f"journalctl -k: {why}"), ev
    if any(w in (ev.stderr or "") for w in _JOURNAL_PARTIAL):
        return kernlog.Read(error="journalctl -k: this user sees only its own journal, not the kernel's "
                                  f"({(ev.stderr or '').strip()[:200]})"), ev
    got = kernlog.parse_journal((ev.stdout or "").splitlines(), keep=kernlog.interesting)
    if got.read == 0 and since is None:
        got.error = "journalctl -k: the journal holds no kernel record of this boot (journald does not keep " \
                    "the kernel log here)"
    if got.read >= lines:
        got.truncated = f"read the newest {lines} records"
    ev.stdout = ""  # the records kept are in the facts; the whole journal is not evidence
    return got, ev


def collect(*, kmsg: str = kernlog.KMSG, journalctl: str | None = None, use_journal: bool = True,
            since: float | None = None, stat_path: str = "/proc/stat",
            dmesg_restrict: str = "/proc/sys/kernel/dmesg_restrict", pci_root: str = PCI_DEVICES
            ) -> tuple[dict[str, Any], list[Evidence]]:
    """The kernel log's facts: from ``kmsg``, else journald; ``since`` (seconds since the epoch) narrows the
    window to the records after it. ``devices_now`` holds each Xid or AER record's PCI device as the bus
    (``pci_root``) shows it now, to check the record against."""
    btime = kernlog.boot_time(stat_path)
    until = time.time()
    attempts: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    got = kernlog.read_kmsg(kmsg, keep=kernlog.interesting)
    source, where = "kmsg", kmsg
    if got.error is None:
        for rec in got.records:
            rec["time"] = kernlog.wall_time(rec["usec"], btime)
    else:
        attempts.append({"source": kmsg, "error": _restrict_note(got.error, got.errno, dmesg_restrict)})
        if use_journal:
            got, ev = read_journal(since, path=journalctl)
            if ev is not None:
                evidence.append(ev)
            source, where = "journalctl", "journalctl -k -o json"
            if got.error is not None:
                attempts.append({"source": "journalctl -k", "error": got.error})
    records = [r for r in got.records if since is None or (r.get("time") is not None and r["time"] >= since)]
    found = kernlog.classify(records)
    look_alikes = found.pop("user_space")[-kernlog.MAX_KEPT:]
    if look_alikes:
        evidence.append(_look_alikes_table(look_alikes))
    if got.error is not None:
        why = "; ".join(f"{a['error']}" for a in attempts)
        return {"skipped": f"the kernel log could not be read: {why}", "attempts": attempts,
                "source": None}, evidence
    if got.kernel == 0:
        # nothing the kernel wrote (an empty log, or user space's records only): no look, never "no Xid"
        why = (f"{where} gave {count_of(got.read, 'record')}, none of them from the kernel's facility: nothing of "
               "the kernel's to judge")
        return {"skipped": f"the kernel log was not examined: {why}",
                "attempts": [*attempts, {"source": where, "error": why}], "source": None,
                "user_space": look_alikes}, evidence
    start = since
    if start is None and source == "kmsg":
        # the window starts at the oldest record the ring still holds
        start = kernlog.wall_time(got.first_usec, btime) if got.first_usec is not None else btime
    if start is None and records:
        start = records[0].get("time")
    facts: dict[str, Any] = {
        "source": source, "path": where, "attempts": attempts,
        "window": {"since": start, "until": until, "boot_time": btime, "since_given": since is not None},
        "records_read": got.read, "kernel_records_read": got.kernel, "truncated": got.truncated,
        "overwritten": got.overwritten,
        **{k: v[-kernlog.MAX_KEPT:] for k, v in found.items()},  # the newest
        "user_space": look_alikes,
        # /dev/kmsg holds only this boot's records, and journalctl -k reads only this boot
        "boot": "this boot",
    }
    buses = {r.get("bus_address") for kind in ("xids", "aer") for r in facts[kind]} - {None}
    facts["devices_now"] = [dict(pci_device(f"{b}.0", pci_root), bus_address=b) for b in sorted(buses)]
    facts = json.loads(json.dumps(facts))
    rows = [[_when(r.get("time")), kind, r.get("bus") or (f"pid {r['pid']}" if r.get("pid") else "-"), r["text"][:200]]
            for kind in ("xids", "api_mismatch", "aer", "ooms") for r in facts[kind]]
    rows.sort(key=lambda row: row[0])
    note = (f"{where}: {got.read} records read ({got.kernel} of the kernel's facility), window {_when(start)} .. "
            f"{_when(until)}" + (f"; {got.truncated}" if got.truncated else "")
            + (f"; {got.overwritten} overwritten while reading" if got.overwritten else ""))
    evidence.insert(0, Evidence.note("The kernel log as read", note))
    if rows:
        evidence.insert(1, Evidence.of_table("NVIDIA, AER and OOM records in the kernel log",
                                             ["time", "kind", "bus / process", "record"], rows[-60:]))
    return facts, evidence


#: The label of the look-alike records' table: shown, never a verdict.
LOOK_ALIKES = "Records that read like the kernel's but are not (not evidence)"


def _look_alikes_table(look_alikes: list[dict[str, Any]]) -> Evidence:
    rows = [[_when(r.get("time")), r["kind"], kernlog.facility_name(r.get("facility")), r["text"][:200], r["why"]]
            for r in look_alikes[-60:]]
    return Evidence.of_table(LOOK_ALIKES, ["time", "reads like", "facility", "record", "why not evidence"], rows)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else "unknown time"


#: zdoctor's own setting (not the training's environment): judge only the records after this time, in
#: seconds since the epoch or ISO 8601 (``2026-12-01T10:00:00+00:00``): after a GPU reset or a reboot, say.
SINCE_ENV = "ZDOCTOR_KERNEL_LOG_SINCE"


def since_setting(value: str | None) -> tuple[float | None, str | None]:
    """:data:`SINCE_ENV`'s value -> (seconds since the epoch, None), or (None, why it is not a time)."""
    if not value or not value.strip():
        return None, None
    try:
        return float(value), None
    except ValueError:
        pass
    try:
        parsed = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        return None, f"{SINCE_ENV}={value[:60]!r} is not a time (seconds since the epoch, or ISO 8601): ignored"
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed.timestamp(), None


@probe("kernel_log", title="The kernel log: NVIDIA Xid and NVRM records, PCIe AER errors, OOM kills", timeout=45.0,
       facts=KernelLogFacts)
def kernel_log_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Reads the kernel log bounded, and keeps the records a GPU node's failures are told by."""
    since, why = since_setting(os.environ.get(SINCE_ENV))
    facts, evidence = collect(since=since)
    if why:
        facts["since_error"] = why
        evidence.append(Evidence.note(f"{SINCE_ENV} not used", why))
    return facts, evidence
