"""The kernel log, read bounded, and the records in it that explain a GPU node's failures.

Readers: :func:`read_kmsg` reads ``/dev/kmsg`` non-blocking (one record per ``read()``: ``prio,seq,usec,
flags;text`` and `` KEY=value`` continuation lines) until it has caught up, bounded by records, bytes and
time; :func:`parse_journal` reads ``journalctl -k -o json`` lines, the fallback where ``/dev/kmsg`` is
refused (``kernel.dmesg_restrict`` for a user without CAP_SYSLOG). Classifiers: :func:`classify` finds
NVIDIA Xid records, NVRM API mismatches, PCIe AER errors and the OOM killer's records. Paths are
parameters, so tests read recorded records.

Evidence is trusted by its source (:func:`not_the_kernels`): a record is the kernel's only when it comes
from the kernel's facility (LOG_KERN, 0; journald's ``_TRANSPORT=kernel`` with ``SYSLOG_FACILITY=0``) and
the driver's own words start the message. Anyone who may write ``/dev/kmsg`` can write an Xid's text, but
the kernel gives a record written from user space LOG_USER at least; and a kernel message that echoes a
name the user chose (a mount's error naming its device) has the text after its own prefix. Such records are
kept apart (``user_space``), shown, never judged.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable

from zdoctor.core.jsondoc import json_objects
from zdoctor.layers.offload.hostram import oom_kills

KMSG = "/dev/kmsg"
#: Records kept (the newest), bytes read and seconds spent at most.
MAX_RECORDS = 50_000
MAX_BYTES = 64 * 1024 * 1024
TIME_LIMIT_S = 3.0
#: Records that matter here are kept in the facts; the rest are only counted.
MAX_KEPT = 400

_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
XID = re.compile(r"NVRM: Xid \((?P<bus>(?:PCI:)?" + _BUS + r")\): (?P<xid>\d+)(?:, pid=(?P<pid>\d+|'?<unknown>'?))?"
                 r"(?:, name=(?P<name>[^,]*))?(?:, (?P<rest>.*))?")
API_MISMATCH = re.compile(r"NVRM: API mismatch: the client has the version (?P<client>\d+(?:\.\d+)+), but")
API_MODULE = re.compile(r"this kernel module has the version (?P<module>\d+(?:\.\d+)+)")
#: aer_print_error: "<driver> 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
AER_BUS_ERROR = re.compile(r"(?:(?P<driver>[\w-]+) )?(?P<bus>" + _BUS + r"): PCIe Bus Error: "
                           r"severity=(?P<severity>[^,]+), type=(?P<type>[^,]+)(?:, \(?(?P<agent>[^)]*)\)?)?")
#: aer_isr_one_error / aer_print_port_info: "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received:
#: 0000:3b:00.0" (older kernels), "AER: Correctable error message received from 0000:3b:00.0" (6.x).
AER_RECEIVED = re.compile(r"(?:[\w-]+ )?(?P<port>" + _BUS + r"): AER: (?:Multiple )?(?P<severity>Corrected|Correctable|"
                          r"Uncorrected \((?:Non-)?Fatal\)|Uncorrectable \((?:Non-)?Fatal\)) error (?:message )?"
                          r"received(?: from)?:? (?:id=\w+ )?(?P<bus>" + _BUS + r")")
#: The lines of the OOM killer's report that :func:`zdoctor.layers.offload.hostram.oom_kills` reads.
OOM_LINE = re.compile(r"oom-kill:constraint=|Out of memory|Memory cgroup out of memory|\bmemory: usage \d+kB, limit")
#: The kernel's facility (LOG_KERN); a record written to /dev/kmsg from user space gets LOG_USER at least.
KERN_FACILITY = 0
#: syslog's facility numbers, named (RFC 5424).
FACILITIES = {0: "kern", 1: "user", 2: "mail", 3: "daemon", 4: "auth", 5: "syslog", 6: "lpr", 7: "news",
              8: "uucp", 9: "cron", 10: "authpriv", 11: "ftp", **{16 + i: f"local{i}" for i in range(8)}}
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def bus_address(text: str | None) -> str | None:
    """A PCI address as domain:bus:device, lowercase (``0000:3b:00``), whichever way it is written: NVML's
    ``00000000:3B:00.0``, the kernel's ``0000:3b:00.0``, an Xid record's ``PCI:0000:3b:00``."""
    m = re.search(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", text or "")
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}"


def _unescape(text: str) -> str:
    """/dev/kmsg writes unprintable bytes as ``\\xNN``; a message of several lines comes back as one."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def parse_kmsg_record(raw: str) -> dict[str, Any] | None:
    """One /dev/kmsg record -> ``{seq, usec, facility, level, text, device, subsystem}``, or None."""
    head, sep, rest = raw.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        return None
    lines = rest.split("\n")
    props = dict(line[1:].split("=", 1) for line in lines[1:] if line.startswith(" ") and "=" in line)
    prio, seq, usec = (_int(p, limit) for p, limit in zip(parts[:3], (1 << 31, 1 << 63, MAX_USEC)))
    if prio is None or seq is None or usec is None:  # out of range: a damaged or forged record, not a fact
        return None
    return {"seq": seq, "usec": usec, "facility": prio >> 3, "level": prio & 7, "transport": "kernel",
            "text": _unescape(lines[0]), "device": props.get("DEVICE"), "subsystem": props.get("SUBSYSTEM")}


def split_records(data: str) -> list[str]:
    """Records of a /dev/kmsg dump read as one text (a record's continuation lines start with a space)."""
    out: list[str] = []
    for line in data.split("\n"):
        if line.startswith(" ") and out:
            out[-1] += "\n" + line
        elif line:
            out.append(line)
    return out


@dataclass
class Read:
    """What a reader got: the records kept (newest last), how many it read, and why it stopped early."""

    records: list[dict[str, Any]] = field(default_factory=list)
    read: int = 0
    truncated: str | None = None
    error: str | None = None
    overwritten: int = 0
    #: The errno of ``error`` (EPERM: kernel.dmesg_restrict), when a call failed.
    errno: int | None = None
    #: Microseconds since boot of the oldest record read: where the window starts.
    first_usec: int | None = None
    #: How many of the records read came from the kernel's facility (the rest were written from user space).
    kernel: int = 0


def read_kmsg(path: str = KMSG, *, max_records: int = MAX_RECORDS, max_bytes: int = MAX_BYTES,
              time_limit: float = TIME_LIMIT_S, keep: Any = None) -> Read:
    """Every record ``path`` gives before it would block, keeping the newest ``max_records`` (those
    ``keep(record)`` accepts, when given). EPIPE (a record overwritten while reading) skips on; an open or
    read refused (EPERM, EACCES) is the ``error``."""
    out = Read()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        out.error, out.errno = f"{path}: {exc.strerror or exc}", exc.errno
        return out
    kept: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_records)
    total = matched = 0
    pending = ""
    deadline = time.monotonic() + time_limit
    try:
        while True:
            if total >= max_bytes:
                out.truncated = f"stopped after {max_bytes} bytes"
                break
            if time.monotonic() > deadline:
                out.truncated = f"stopped after {time_limit:g} s"
                break
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    out.overwritten += 1
                    continue
                if exc.errno == errno.EINTR:
                    continue
                out.error, out.errno = f"{path}: {exc.strerror or exc}", exc.errno
                break
            if not chunk:
                break
            over = total + len(chunk) > max_bytes
            if over:  # what is past the limit is not read (a record cut there is dropped below)
                chunk = chunk[:max_bytes - total]
            total += len(chunk)
            pending += chunk.decode("utf-8", "replace")
            # /dev/kmsg gives one whole record per read; a dump read as a file gives many, the last maybe cut
            body, _, pending = pending.rpartition("\n") if not pending.endswith("\n") else (pending, "", "")
            for raw in split_records(body):
                rec = parse_kmsg_record(raw)
                if rec is None:
                    continue
                out.read += 1
                out.kernel += from_kernel(rec)
                if out.first_usec is None:
                    out.first_usec = rec["usec"]
                if keep is None or keep(rec):
                    kept.append(rec)
                    matched += 1
            if over:
                out.truncated = f"stopped after {max_bytes} bytes"
                break
    finally:
        os.close(fd)
    if matched > len(kept):
        out.truncated = out.truncated or f"kept the newest {len(kept)} of {matched} records"
    out.records = list(kept)
    return out


def parse_journal(lines: Iterable[str], keep: Any = None) -> Read:
    """``journalctl -k -o json`` lines -> records like :func:`parse_kmsg_record`'s (``seq`` is None; ``time``
    from ``__REALTIME_TIMESTAMP``). A MESSAGE journald stored as bytes (not UTF-8) is decoded."""
    out = Read()
    for d in json_objects(lines):
        msg = d.get("MESSAGE")
        if isinstance(msg, list):
            msg = bytes(b & 0xFF for b in msg if isinstance(b, int)).decode("utf-8", "replace")
        if not isinstance(msg, str):
            continue
        out.read += 1
        rec = {"seq": None, "usec": _int(d.get("_SOURCE_MONOTONIC_TIMESTAMP")),
               "facility": _int(d.get("SYSLOG_FACILITY")), "level": _int(d.get("PRIORITY")),
               "transport": d.get("_TRANSPORT") if isinstance(d.get("_TRANSPORT"), str) else None, "text": msg,
               "device": d.get("_KERNEL_DEVICE"), "subsystem": d.get("_KERNEL_SUBSYSTEM")}
        out.kernel += from_kernel(rec)
        realtime = _int(d.get("__REALTIME_TIMESTAMP"))
        rec["time"] = realtime / 1e6 if realtime is not None else None
        if keep is None or keep(rec):
            out.records.append(rec)
    return out


#: The largest microseconds-since-boot (or since the epoch) a record may carry: 300 years.
MAX_USEC = 300 * 365 * 24 * 3600 * 10**6


def _int(v: Any, limit: int = MAX_USEC) -> int | None:
    """``v`` as an integer in ``[0, limit)``, or None (absent, not a number, or out of range)."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if 0 <= n < limit else None


def boot_time(stat_path: str = "/proc/stat") -> float | None:
    """The wall time the machine booted (``btime`` of /proc/stat), for a record's microseconds since boot."""
    try:
        with open(stat_path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def interesting(rec: dict[str, Any]) -> bool:
    """A record :func:`classify` may use or show (the rest are only counted)."""
    text = rec.get("text") or ""
    return "NVRM:" in text or "AER:" in text or "PCIe Bus Error" in text or bool(OOM_LINE.search(text)) \
        or "this kernel module has the version" in text


def from_kernel(rec: dict[str, Any]) -> bool:
    """Whether the record came from the kernel's facility: LOG_KERN in /dev/kmsg, or journald's kernel
    transport with LOG_KERN (a record written to /dev/kmsg from user space reaches journald by the kernel
    transport too, with its LOG_USER facility)."""
    return rec.get("facility") == KERN_FACILITY and rec.get("transport") == "kernel"


#: Why a kernel-facility record whose driver words are not at its start is no evidence.
NOT_AT_START = ("the kernel's facility, but the driver's words are not at the start of the message (another "
                "message quoting a text someone chose): not evidence")


def facility_name(number: Any) -> str:
    """``user``, ``daemon``, ``local0``..., or ``unknown`` (journald gave none)."""
    return FACILITIES.get(number, str(number)) if isinstance(number, int) else "unknown"


def not_the_kernels(rec: dict[str, Any]) -> str | None:
    """Why the record is no kernel evidence, or None when it is: the kernel's facility and one of the
    driver's, the AER service's or the OOM killer's own messages from the message's first character."""
    if not from_kernel(rec):
        if rec.get("transport") != "kernel":
            return f"sent by {rec.get('transport') or 'an unknown transport'}, not the kernel's: not evidence"
        if not isinstance(rec.get("facility"), int):
            return "its facility is not known, so not the kernel's: not evidence"
        return f"written from user space (facility {facility_name(rec['facility'])}), not the kernel's: not evidence"
    text = rec.get("text") or ""
    if XID.match(text) or API_MISMATCH.match(text) or AER_BUS_ERROR.match(text) or AER_RECEIVED.match(text) \
            or OOM_LINE.match(text) or text.startswith("NVRM: "):
        return None
    return NOT_AT_START


def _look_alike(rec: dict[str, Any], why: str) -> dict[str, Any] | None:
    """A record that reads like the driver's, AER's or the OOM killer's but is not the kernel's: what it
    claims (``kind``) and why it is not evidence, for display only."""
    text = rec.get("text") or ""
    kind = ("Xid" if XID.search(text) else "NVRM" if "NVRM:" in text
            else "AER" if AER_BUS_ERROR.search(text) or AER_RECEIVED.search(text) or "AER:" in text
            else "OOM" if OOM_LINE.search(text) else None)
    if kind is None:
        return None
    return {**{k: rec.get(k) for k in ("seq", "usec", "time", "facility", "level")}, "text": text[:500],
            "kind": kind, "why": why}


def classify(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``{xids, api_mismatch, aer, ooms, user_space}`` from records in log order. Only the kernel's own
    records (:func:`not_the_kernels`) go to the first four, which the checks judge; a look-alike goes to
    ``user_space``, with why it is no evidence. Each entry carries its record's ``seq``, ``usec``, ``time``,
    ``facility`` and ``text``, and the bus (``bus`` as written, ``bus_address``) or the process it names."""
    kernel: list[dict[str, Any]] = []
    user_space: list[dict[str, Any]] = []
    for rec in records:
        why = not_the_kernels(rec)
        if why is None:
            kernel.append(rec)
            continue
        look_alike = _look_alike(rec, why)
        if look_alike is not None:
            user_space.append(look_alike)
    return {**_classify_kernels(kernel), "user_space": user_space}


def _classify_kernels(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """:func:`classify` of records already known to be the kernel's (driver words at their start)."""
    xids: list[dict[str, Any]] = []
    mismatch: list[dict[str, Any]] = []
    aer: list[dict[str, Any]] = []
    oom_recs: list[dict[str, Any]] = []
    for i, rec in enumerate(records):
        text = rec.get("text") or ""
        base = {k: rec.get(k) for k in ("seq", "usec", "time", "facility", "level")}
        base["text"] = text[:500]
        m = XID.match(text)
        if m:
            pid = m.group("pid")
            xids.append({**base, "bus": m.group("bus"), "bus_address": bus_address(m.group("bus")),
                         "xid": int(m.group("xid")),
                         "pid": int(pid) if pid and pid.isdigit() else None,
                         "name": (m.group("name") or "").strip() or None, "detail": (m.group("rest") or "").strip()})
            continue
        m = API_MISMATCH.match(text)
        if m:
            module = API_MODULE.search(text[m.end():])
            following = records[i + 1].get("text") or "" if i + 1 < len(records) else ""
            if module is None and following.startswith("NVRM: "):
                module = API_MODULE.search(following)
            mismatch.append({**base, "client": m.group("client"), "module": module.group("module") if module else None})
            continue
        m = AER_BUS_ERROR.match(text) or AER_RECEIVED.match(text)
        if m:
            groups = m.groupdict()
            aer.append({**base, "bus": groups["bus"], "bus_address": bus_address(groups["bus"]),
                        "severity": _aer_severity(groups["severity"]), "severity_text": groups["severity"].strip(),
                        "type": (groups.get("type") or "").strip() or None, "driver": groups.get("driver"),
                        "port": groups.get("port")})
            continue
        if OOM_LINE.match(text):
            oom_recs.append({**base, "_text": text})
    ooms = []
    for k in oom_kills([r["_text"] for r in oom_recs], limit=len(oom_recs) + 1):
        rec = oom_recs[k["line"] - 1]
        base = {key: rec.get(key) for key in ("seq", "usec", "time", "facility", "level")}
        k.pop("line", None)  # a place among the OOM lines, not the log's: the record's seq and time say where
        ooms.append({**k, **base, "text": k["text"]})
    return {"xids": xids, "api_mismatch": mismatch, "aer": aer, "ooms": ooms}


def _aer_severity(text: str) -> str:
    """corrected | nonfatal | fatal, whichever way the kernel release words it."""
    t = text.lower()
    if "non-fatal" in t:
        return "nonfatal"
    if "fatal" in t:
        return "fatal"
    return "corrected"


def records_at(facts: Mapping[str, Any], buses: list[str | None]) -> list[dict[str, Any]]:
    """The Xid and AER records of the kernel_log probe's ``facts`` at any of ``buses`` (written any way), in
    log order (by time)."""
    keys = {bus_address(b) for b in buses if b} - {None}
    found = [dict(r, kind="Xid") for r in facts.get("xids") or [] if r.get("bus_address") in keys]
    found += [dict(r, kind="AER") for r in facts.get("aer") or [] if r.get("bus_address") in keys]
    return sorted(found, key=lambda r: (r.get("time") or 0.0))


def wall_time(usec: int | None, btime: float | None) -> float | None:
    """Microseconds since boot -> seconds since the epoch (None when either is unknown)."""
    if usec is None or btime is None:
        return None
    return btime + usec / 1e6
