"""Checks and predicates over the ``storage`` and ``nvme_inventory`` probes: is the offload disk the
bottleneck, which device is it, how fast is it, and the exact fix (an NVMe mounted by UUID, a
directory owned by the training user)."""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import NvmeInventoryFacts, StorageFacts
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.packages import package_name
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.core.shellquote import shell_quote
from zdoctor.layers.offload import blockdev as bd
from zdoctor.layers.offload import fstab as fs
from zdoctor.layers.offload.iotest import explain_odirect, human, rate
from zdoctor.layers.python_env.check_dsrelease import libaio_remedies_for_dpkg_only
from zdoctor.symptoms.match import ids_for

#: Below this sustained sequential rate (bytes/s, either direction) offload waits on the disk.
SLOW_BPS = 1.0e9
#: An NVMe drive measuring below this share of its link's theoretical rate is underperforming.
LINK_SHARE_WARN = 0.3
REFERENCE = ("For scale: DeepSpeed's tuning of one PCIe Gen4 consumer SSD reached 3.69 GB/s read and 3.18 GB/s "
             "write; four Gen4 drives in RAID-0 about 10 GB/s read and 5 GB/s write.")







def _storage_why_not(facts: Facts, name: str = "storage") -> str:
    """Why the storage facts are missing, with how to give the offload path."""
    hint = ("" if name != "storage" else "\nGive the offload directory with --offload-path DIR, or the job's "
            "config with --ds-config FILE (its zero_optimization.offload_*.nvme_path).")
    return facts.why_not(name) + hint


def _fast_enough(st: StorageFacts) -> bool:
    """Whether the offload path sits on fast storage, by device class or by measurement."""
    dev = st.get("device") or {}
    measured = _slowest(st)
    if measured is not None:
        return measured >= SLOW_BPS
    return dev.get("speed_class") == "fast"


def _slowest(st: StorageFacts) -> float | None:
    tp = st.get("throughput") or {}
    if not tp.get("ran"):
        return None
    rates = [p["bps"] for p in (tp.get("write"), tp.get("read")) if p and p.get("bps")]
    return min(rates) if rates else None


def _user_of(facts: Facts, st: Mapping[str, Any] | None) -> dict[str, Any]:
    """The training user the storage probe chose (also when it skipped: it needs no offload path)."""
    if st and st.get("user"):
        return st["user"]
    try:
        raw = facts["storage"].facts or {}
    except KeyError:
        return {}
    user = raw.get("user")
    return user if isinstance(user, dict) else {}


def _dir_remedy(st: StorageFacts, directory: str | None = None, user: Mapping[str, Any] | None = None) -> Remedy:
    who: Mapping[str, Any] = user or st.get("user") or {}
    return fs.offload_dir_remedy(directory or st["path"], who.get("name") or "root", who.get("group") or "root",
                                 rule=who.get("rule"))


# -------------------------------------------------------------------------------------------- findings
@check("storage.mount", title="Offload path: mount and file system", probes=("storage",))
def check_mount(facts: Facts, me: CheckSpec) -> list[Finding]:
    st = me.require(facts.of("storage"), _storage_why_not(facts))
    ev = facts.evidence("storage", kinds=None, labels=("where offload writes",))
    m = st.get("mount") or {}
    path = st["path"]
    where = f"{m.get('fstype')} at {m.get('point')} (from {m.get('source')})" if m else "an unknown mount"
    head = f"Offload path: {path} ({st.get('source')})\nIt lives on {where}."
    if st.get("fstab_unmounted"):
        e = st["fstab_unmounted"][0]
        return [me.finding(
            status="fail", title=f"{e['file']} is not mounted: offload writes to {m.get('point')} instead",
            detail=(f"{head}\n{st['fstab_path']}:{e['line_no']} mounts {e['spec']} at {e['file']}, but nothing is "
                    f"mounted there, so DeepSpeed's swap files go into the empty directory, onto the disk that "
                    f"holds {m.get('point')}. Mount it (and find out why it was not mounted at boot: "
                    "`journalctl -b -u local-fs.target`)."),
            evidence=ev, remedies=[fs.mount_remedy(e["file"])])]
    if not m:
        return [me.finding(status="warn", title=f"Cannot tell where {path} is mounted",
                           detail=head + "\nNo mount in /proc/self/mountinfo holds it.", evidence=ev)]
    if not m.get("fit"):
        return [me.finding(status="fail",
                        title=f"Offload path {path} is on {m.get('fstype')}: unfit for NVMe offload",
                        detail=f"{head}\n{m.get('unfit_reason')}.\nPut nvme_path on a local NVMe filesystem (ext4 or "
                               "xfs); storage.fstab shows how when an unused NVMe drive is present.", evidence=ev)]
    findings_detail = [head]
    sp = st.get("space") or {}
    if sp:
        findings_detail.append(f"Free: {human(sp.get('avail_bytes'))} of {human(sp.get('total_bytes'))}.")
    if not m.get("noatime"):
        findings_detail.append("Mounted without noatime (relatime is fine for O_DIRECT swap files).")
    acc = st.get("access") or {}
    user = st.get("user") or {}
    if st.get("exists") is False:
        return [me.finding(status="warn", title=f"Offload path {path} does not exist yet",
                        detail="\n".join(findings_detail) + f"\nDeepSpeed creates it when the training user may write "
                               f"to {st.get('probed_path')} (owner {acc.get('owner')}, mode {acc.get('mode')}). "
                               "Create it now with the right owner and mode.",
                        evidence=ev, remedies=[_dir_remedy(st)])]
    if m.get("network"):
        return [me.finding(status="warn", title=f"Offload path {path} is on a shared network file system "
                           f"({m.get('fstype')})", detail="\n".join(findings_detail) + "\nEvery node's swap traffic "
                           "crosses the network; a local NVMe drive is faster and private to the node.", evidence=ev)]
    mode = int(acc.get("mode") or "0", 8)
    if acc and mode & 0o002 and not mode & 0o1000:
        return [me.finding(status="warn", title=f"Offload directory {path} is world-writable (mode {acc['mode']})",
                           detail="\n".join(findings_detail) + "\nAnyone on the node can replace or delete the swapped "
                                  "optimizer state. Own it by the training user with mode 0750 (1777 only if several "
                                  "users must share it).", evidence=ev, remedies=[_dir_remedy(st)])]
    if acc and acc.get("user_writable") is False:
        return [me.finding(status="fail", title=f"Offload directory {path} is not writable",
                           detail="\n".join(findings_detail) + f"\nOwner {acc.get('owner')}:{acc.get('group')}, mode "
                                  f"{acc.get('mode')}; DeepSpeed, running as {user.get('name')}"
                                  + (f" (the training user, chosen by: {user['rule']})" if user.get("rule") else "")
                                  + ", cannot create its swap "
                                  "files there.", evidence=ev, remedies=[_dir_remedy(st)])]
    return [me.finding(status="ok", title=f"Offload path {path}: {m.get('fstype')} on {m.get('point')}",
                       detail="\n".join(findings_detail), evidence=ev)]


def _stack_table(dev: dict[str, Any]) -> Evidence:
    rows: list[list[str]] = []
    hl = []

    def walk(d: dict[str, Any], depth: int) -> None:
        kind = d.get("kind") or "?"
        link = bd.link_label((d.get("nvme") or {}).get("link")) if kind == "nvme" else ""
        rotational = d.get("rotational")
        rot = "yes" if rotational is True else "no" if rotational is False else "?"
        if d.get("speed_class") in ("slow", "ram") and not d.get("members"):
            hl.append(len(rows))
        rows.append(["  " * depth + d.get("name", "?"), kind, d.get("model") or "", human(d.get("size_bytes")),
                     rot, link])
        for mem in d.get("members") or []:
            walk(mem, depth + 1)

    walk(dev, 0)
    return Evidence.of_table("device stack", ["device", "kind", "model", "size", "rotational", "link"], rows, hl)


def _max_label(link: dict[str, Any]) -> str:
    return bd.link_label({"current_gts": link.get("max_gts"), "current_width": link.get("max_width"),
                          "generation": link.get("max_generation"), "theoretical_bps": link.get("max_theoretical_bps")})


KIND_LABEL = {"nvme": "NVMe", "ssd": "SATA/SAS SSD", "hdd": "rotational disk", "virtio": "virtio",
              "virtual": "virtual disk", "usb": "USB", "mmc": "SD/eMMC", "network": "network storage",
              "ram": "RAM disk", "mixed": "mixed devices", "unknown": "unknown device"}


def _names(dev: dict[str, Any]) -> str:
    """``loop0 on vda`` / ``dm-0 on nvme3n1+nvme4n1`` / ``nvme0n1p2 on nvme0n1``."""
    disks = [d for d in dev.get("disks") or [] if d != dev["name"]]
    return dev["name"] + (f" on {'+'.join(disks)}" if disks else "")


def _where(dev: dict[str, Any]) -> str:
    """``dm-0 on nvme3n1+nvme4n1, NVMe``."""
    kind = dev.get("effective_kind")
    return f"{_names(dev)}, {KIND_LABEL.get(str(kind), kind)}"


@check("storage.device", title="Offload device: kind and link", probes=("storage",))
def check_device(facts: Facts, me: CheckSpec) -> list[Finding]:
    st = me.require(facts.of("storage"), _storage_why_not(facts))
    dev = st.get("device")
    if not dev:
        return [me.finding(status="skip", title="Offload device: no block device",
                           detail=st.get("device_error") or "the mount has no block device under it")]
    ev = [_stack_table(dev)]
    cls = dev.get("speed_class")
    kind = dev.get("effective_kind")
    measured = _slowest(st)
    lines = [f"{st['path']} is on {bd.describe_device(dev)}."]
    links = [(leaf["name"], (leaf.get("nvme") or {}).get("link")) for leaf in bd.leaves(dev)
             if leaf.get("kind") == "nvme"]
    for name, link in links:
        if link:
            lines.append(f"{name}: {bd.link_label(link)}"
                         + (f", capable of {_max_label(link)}" if link.get("downtrained") else ""))
    if measured is not None:
        lines.append(f"Measured: {rate(measured)} in the slower direction (storage.throughput has the details).")
    where = _where(dev)
    if cls in ("slow", "ram"):
        what = {"hdd": "a rotational disk", "network": "network storage", "usb": "a USB disk", "mmc": "an SD/eMMC card",
                "ram": "a RAM disk"}.get(str(kind), kind)
        # with a measurement, storage.throughput carries the verdict on speed; this finding names the device
        status = "fail" if measured is None else "warn"
        return [me.finding(status=status, title=f"Offload goes to {what} ({_names(dev)})",
                           detail="\n".join(lines + [f"NVMe offload streams optimizer state and parameters every step; "
                                                     f"{what} cannot keep up. {REFERENCE}"]), evidence=ev)]
    if cls == "medium":
        return [me.finding(status="warn", title=f"Offload goes to a SATA/SAS SSD ({_names(dev)})",
                           detail="\n".join(lines + ["SATA tops out near 0.55 GB/s; an NVMe drive is 6-12x faster. "
                                                     + REFERENCE]), evidence=ev)]
    if cls == "unknown":
        if measured is not None:
            return [me.finding(status="ok", title=f"Offload goes to {where}, measured {rate(measured)}",
                            detail="\n".join(lines + ["The device type does not tell its speed (a virtual disk is as "
                                                      "fast as what backs it); the measurement does."]), evidence=ev)]
        return [me.finding(status="warn", title=f"Offload goes to {where}: speed unknown",
                        detail="\n".join(lines + ["A virtual or unrecognised disk is as fast as whatever backs it "
                                                  "(virtio disks report rotational=1 whatever the host has). Measure "
                                                  "it: zdoctor check --offload-path DIR --io-size 1G."]), evidence=ev)]
    down = [(n, lk) for n, lk in links if lk and lk.get("downtrained")]
    if down:
        return [me.finding(status="warn", title=f"NVMe link of {down[0][0]} runs below what it can do",
                           detail="\n".join(lines + ["The drive negotiated a slower or narrower PCIe link than it "
                                                     "supports (a slot wired for fewer lanes, a riser, an older slot, "
                                                     "or power saving). Check `lspci -vv` LnkSta against LnkCap."]),
                           evidence=ev)]
    return [me.finding(status="ok", title=f"Offload goes to {where}", detail="\n".join(lines), evidence=ev)]


@check("storage.odirect", title="O_DIRECT on the offload path", probes=("storage",))
def check_odirect(facts: Facts, me: CheckSpec) -> list[Finding]:
    st = me.require(facts.of("storage"), _storage_why_not(facts))
    od = st.get("odirect") or {}
    text = explain_odirect(od) if od else "not tested"
    if od.get("ok"):
        return [me.finding(status="ok", title="O_DIRECT works on the offload path", detail=text + ".")]
    if od.get("ok") is None:
        return [me.finding(status="warn", title="O_DIRECT could not be tested on the offload path",
                           detail=text + ". Run zdoctor as the training user or as root.")]
    return [me.finding(status="fail", title="O_DIRECT fails on the offload path", detail=(
        text + ". DeepSpeed's async_io opens every swap file with O_DIRECT; on this file system NVMe offload "
        "fails at the first swap. Use a local ext4 or xfs filesystem."))]


@check("storage.libaio", title="libaio for DeepSpeed's async_io op", probes=("storage",),
       optional=("dsrelease", "toolchain"), explains=("undefined-reference", "libaio-missing"))
def check_libaio(facts: Facts, me: CheckSpec) -> list[Finding]:
    st = facts.of("storage")
    if st is None:
        return [me.not_checked("Only NVMe offload needs libaio, and no offload path was given: "
                               + facts.why_not("storage"))]
    la = st.get("libaio")
    if not la:
        return [me.not_checked("no libaio facts")]
    ev = facts.evidence("storage", kinds=None, labels=("compile and link a libaio", "run the libaio test program"))
    found = (f"runtime library: {la.get('runtime') or 'not found'}; header libaio.h: {la.get('header') or 'not found'};"
             f" linkable libaio.so: {la.get('dev_library') or 'not found'}")
    lt = la.get("link_test") or {}
    if lt.get("ran"):
        found += f"\nTest build with {lt.get('compiler')} -laio: {'links' if lt.get('ok') else lt.get('error')}"
        found += "\n" + _aio_calls_line(lt)
    if la.get("ok"):
        calls = lt.get("calls")
        title = ("libaio makes the calls DeepSpeed's async_io makes (" + ", ".join(_called(lt)) + ")" if calls
                 else "libaio links and runs its core calls; which calls the installed DeepSpeed makes is unknown"
                 if lt.get("ran") else "libaio is there for DeepSpeed's async_io op")
        return [me.finding(status="ok", title=title, detail=found, evidence=ev)]
    if lt.get("ran") and lt.get("failed_call") and lt.get("ok") is False and la.get("header") \
            and la.get("dev_library"):
        call = lt["failed_call"]
        return [me.finding(status="fail",
                           title=f"libaio has no {call}, which DeepSpeed's async_io calls: the op cannot be built",
                           detail=found + f"\n{call} is in DeepSpeed's csrc/aio sources but not in this libaio "
                                  + ("(io_pgetevents came with libaio 0.3.111; older releases such as CentOS 7's "
                                     "0.3.109 lack it)" if call == "io_pgetevents" else "") + ".",
                           evidence=ev, remedies=_newer_libaio_remedies(la),
                           explains=ids_for(facts, "undefined-reference", symbol=call))]
    if lt.get("ran") and lt.get("ok") and lt.get("ran_ok") is False:
        call, rc = lt.get("failed_call") or "a libaio call", lt.get("returned")
        errname = errno.errorcode.get(-rc, str(rc)) if isinstance(rc, int) and rc < 0 else None
        return [me.finding(status="fail",
                           title=f"libaio's {call} fails here" + (f" ({errname})" if errname else "")
                                 + ": DeepSpeed's async_io would fail at its first swap",
                           detail=found + "\nThe library links, but the kernel refuses the call: "
                                  + ("EAGAIN from io_setup/io_queue_init means /proc/sys/fs/aio-max-nr is used up "
                                     "(`cat /proc/sys/fs/aio-nr /proc/sys/fs/aio-max-nr`); ENOSYS or EPERM means "
                                     "the kernel or a sandbox (seccomp, gVisor) does not offer native AIO."),
                           evidence=ev)]
    remedies: list[Remedy] = []
    withheld: list[str] = []
    if _release_checks_dpkg_only(facts) and la.get("package") != package_name("libaio headers", "apt"):
        remedies, withheld = libaio_remedies_for_dpkg_only((facts.of("toolchain") or {}).get("distro") or {})
    elif la.get("install"):
        remedies.append(Remedy(title=f"Install {la['package']}", commands=[la["install"]], verified=False,
                               requires_root=True, undo=[],
                               explanation="DeepSpeed's async_io op compiles against libaio.h and links -laio when "
                                           "NVMe offload starts; the runtime library alone is not enough."))
    return [me.finding(status="fail", title="libaio development files missing: NVMe offload cannot build async_io",
                       detail=found + "\nDeepSpeed stops with: async_io requires the dev libaio .so object and headers "
                                      "but these were not found." + ("" if la.get("install") else
                                      " Install your distribution's libaio development package.")
                              + "".join("\n" + line for line in withheld),
                       evidence=ev, remedies=remedies, explains=ids_for(facts, "libaio-missing"))]


def _release_checks_dpkg_only(facts: Facts) -> bool:
    """Whether the installed DeepSpeed's async_io decides libaio by dpkg alone (the dsrelease probe's rule)."""
    rules = (facts.of("dsrelease") or {}).get("rules") or {}
    return (rules.get("libaio-detection") or {}).get("state") == "old"


def _called(lt: dict[str, Any]) -> list[str]:
    p = lt.get("plan") or {}
    return [p.get("init") or "io_setup", "io_submit", p.get("wait") or "io_getevents", p.get("release") or "io_destroy"]


def _aio_calls_line(lt: dict[str, Any]) -> str:
    if lt.get("calls"):
        srcs = lt.get("calls_source") or []
        return (f"DeepSpeed's async_io calls (from {count_of(len(srcs), 'file')} of its csrc/aio): "
                f"{', '.join(lt['calls'])}; "
                f"the test made {', '.join(_called(lt))}"
                + ("" if lt.get("ran_ok") is None else ": they ran" if lt.get("ran_ok") else ": they failed") + ".")
    return (f"Which libaio calls DeepSpeed makes is unknown ({lt.get('calls_why') or 'its sources were not read'}); "
            f"the test made libaio's core calls ({', '.join(_called(lt))}).")


def _newer_libaio_remedies(la: dict[str, Any]) -> list[Remedy]:
    out = []
    if la.get("install"):
        out.append(Remedy(title=f"Install the distribution's newest {la['package']}", commands=[la["install"]],
                          requires_root=True, note="not tried: it needs root",
                          explanation="Only helps where the distribution ships libaio 0.3.111 or newer."))
    out.append(Remedy(title="Use a newer libaio from conda-forge in the training environment",
                      commands=["conda install -c conda-forge 'libaio>=0.3.111'",
                                'export CFLAGS="-I$CONDA_PREFIX/include" LDFLAGS="-L$CONDA_PREFIX/lib"'],
                      note="not tried: it installs packages",
                      explanation="DeepSpeed's op build reads CFLAGS/LDFLAGS (and CONDA_PREFIX) to find libaio."))
    return out


@check("storage.throughput", title="Offload path throughput (O_DIRECT, 1 MiB blocks)", probes=("storage",))
def check_throughput(facts: Facts, me: CheckSpec) -> list[Finding]:
    st = me.require(facts.of("storage"), _storage_why_not(facts))
    tp = st.get("throughput") or {}
    if not tp.get("ran"):
        return [me.finding(status="skip", title="Offload throughput: not measured",
                           detail=f"{tp.get('reason') or 'not asked for'}.")]
    w, r = tp.get("write") or {}, tp.get("read") or {}
    rows = [["write + fsync", human(w.get("bytes")), f"{w.get('seconds', 0):.2f} s", rate(w.get("bps"))]]
    if r:
        rows.append(["read", human(r.get("bytes")), f"{r.get('seconds', 0):.2f} s", rate(r.get("bps"))])
    link = tp.get("link_bps")
    if link:
        rows.append(["PCIe link (theoretical)", "", "", rate(link)])
    slowest = _slowest(st)
    hl = [i for i, row in enumerate(rows[:2]) if slowest is not None and row[3] == rate(slowest) and slowest < SLOW_BPS]
    ev = [Evidence.of_table("O_DIRECT sequential throughput", ["phase", "bytes", "time", "rate"], rows, hl)]
    how = (f"{human(tp.get('size_bytes'))} in {human(tp.get('block_bytes'))} blocks, {tp.get('queue_depth')} in flight "
           f"(DeepSpeed's aio defaults), O_DIRECT, file removed afterwards.")
    if w.get("timed_out") or r.get("timed_out"):
        how += f" Stopped at the {tp.get('time_limit_s'):g} s limit; the rate is from what was done."
    if tp.get("error"):
        return [me.finding(status="warn", title="Offload throughput test failed", detail=f"{tp['error']}\n{how}",
                           evidence=ev)]
    if slowest is None:
        return [me.finding(status="warn", title="Offload throughput: nothing measured", detail=how, evidence=ev)]
    summary = f"write {rate(w.get('bps'))}, read {rate(r.get('bps'))}"
    if slowest < SLOW_BPS:
        return [me.finding(status="fail", title=f"Offload disk is the bottleneck: {summary}",
                           detail=f"{how}\nBelow {rate(SLOW_BPS)} every swap of optimizer state waits on the disk. "
                                  + REFERENCE, evidence=ev, remedies=_slow_disk_remedies(st))]
    ratio = tp.get("ratio")
    if ratio is not None and ratio < LINK_SHARE_WARN:
        return [me.finding(status="warn", title=f"Offload NVMe is well below its link: {summary}",
                           detail=f"{how}\nThe slower direction reaches {ratio:.0%} of the link's theoretical "
                                  f"{rate(link)}. Thermal throttling, a nearly full or DRAM-less drive, or other I/O "
                                  "on it are the usual reasons. " + REFERENCE, evidence=ev)]
    return [me.finding(status="ok", title=f"Offload throughput: {summary}", detail=how, evidence=ev)]


def _slow_disk_remedies(st: StorageFacts) -> list[Remedy]:
    """What to do about an offload disk slower than offload needs: keep the optimizer states in host memory,
    or tune DeepSpeed's aio settings for this drive (alternatives; neither tried here)."""
    where = str(st.get("path") or st.get("probed_path") or "")
    out = [Remedy(title="Keep the optimizer states in CPU memory: zero_optimization.offload_optimizer.device "
                        "\"cpu\" (and offload_param.device \"cpu\") in the ds_config",
                  explanation="With device cpu the optimizer states stay in pinned host memory and never go to the "
                              "disk; it needs host RAM for them (the offload.capacity finding says whether this "
                              "node has it).",
                  note="not tried, because it changes the training's config and its host memory use")]
    if where:
        out.append(Remedy(title="Measure this drive's best aio settings with DeepSpeed's ds_nvme_tune and put them "
                                "in the ds_config's aio block",
                          commands=[f"ds_nvme_tune --nvme_dir {shell_quote(where)}"],
                          explanation="ds_nvme_tune sweeps aio block_size, queue_depth and submit modes on the drive "
                                      "and prints the aio settings that read and write fastest there.",
                          note="not tried, because the sweep writes and reads gigabytes on the drive for minutes"))
    return out


def _link_text(link: dict[str, Any] | None) -> str:
    text = bd.link_label(link)
    return text + (f", can do {_max_label(link)}" if link and link.get("downtrained") else "")


def _usable(inv: NvmeInventoryFacts) -> list[dict[str, Any]]:
    """Local (PCIe) NVMe drives with nothing of them mounted or used as swap."""
    return [d for d in inv.get("drives") or [] if d.get("unmounted") and d.get("kind") == "nvme"]


@check("storage.unmounted-nvme", title="NVMe drives present but unused", probes=("nvme_inventory", "storage"))
def check_unmounted(facts: Facts, me: CheckSpec) -> list[Finding]:
    inv = me.require(facts.of("nvme_inventory"), _storage_why_not(facts, "nvme_inventory"))
    ev = facts.evidence("nvme_inventory", kinds=None, labels=("NVMe drives",))
    drives = inv.get("drives") or []
    if not drives:
        return [me.finding(status="ok", title="No NVMe drives on this node",
                           detail="No NVMe namespace in sysfs: NVMe offload needs a local NVMe drive (or another fast "
                                  "local disk).", evidence=ev)]
    free = _usable(inv)
    if not free:
        in_use = (f"All {count_of(len(drives), 'NVMe drive')} are in use" if len(drives) != 1
                  else "The one NVMe drive is in use")
        return [me.finding(status="ok", title=in_use,
                           detail="\n".join(f"{d['name']}: {d['reason']}" for d in drives), evidence=ev)]
    st = facts.of("storage")
    lines = [f"{d['name']} ({human(d.get('size_bytes'))}, {d.get('model') or '?'}, {_link_text(d.get('link'))}): "
             f"{d['state']}, {d['reason']}" for d in free]
    blanks = [d for d in free if d["state"] == "blank"]
    if len(blanks) >= 2:
        lines.append(f"{len(blanks)} blank drives: striped together (RAID-0) they add up their bandwidth.")
    on_fast = st is not None and (st.get("mount") or {}).get("fit") and _fast_enough(st)
    status = "ok" if on_fast else "warn"
    title = (f"{count_of(len(free), 'NVMe drive')} present but not mounted: " + ", ".join(d["name"] for d in free))
    if not on_fast:
        lines.append("Offload is not on fast local storage while these drives sit idle; storage.fstab has the steps.")
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev)]


@check("storage.fstab", title="fstab: mounting offload storage by UUID", probes=("storage", "nvme_inventory"))
def check_fstab(facts: Facts, me: CheckSpec) -> list[Finding]:
    st = facts.of("storage")
    inv = facts.of("nvme_inventory")
    sug = (inv or {}).get("suggestion")
    needs_move = st is None or not (st.get("mount") or {}).get("fit") or not _fast_enough(st) \
        or not (st.get("odirect") or {}).get("ok", True)
    if sug and needs_move:
        user = _user_of(facts, st)
        remedies = []
        if sug.get("needs_mkfs"):
            remedies.append(fs.mkfs_remedy(sug["device"], sug["fstype"], sug["uuid"]))
        remedies.append(fs.fstab_remedy(sug["uuid"], sug["mountpoint"], sug["fstype"]))
        remedies.append(_dir_remedy(st or {}, sug["offload_dir"], user))
        for r in remedies:  # format (when blank), mount, create the directory: one fix, in this order
            r.step = True
        detail = [f"Unused NVMe drive {sug['drive']}: mount {sug['device']} (UUID {sug['uuid']}) at "
                  f"{sug['mountpoint']} and offload into {sug['offload_dir']}."]
        if sug.get("needs_mkfs"):
            detail.append("The drive is blank: formatting it is a separate, destructive step, asked for on its own.")
        else:
            detail.append(f"It already holds a {sug['fstype']} filesystem; mounting keeps its files (look before "
                          "you use it).")
        detail.append(f"Then set zero_optimization.offload_optimizer.nvme_path (and offload_param.nvme_path) to "
                      f"{sug['offload_dir']}.")
        if st is not None:
            m = st.get("mount") or {}
            on = bd.describe_device(st["device"]) if st.get("device") else f"{m.get('fstype')} at {m.get('point')}"
            detail.insert(0, f"Offload now goes to {st['path']} on {on}.")
        line = fs.fstab_line(sug["uuid"], sug["mountpoint"], sug["fstype"])
        return [me.finding(status="warn", title=f"Put offload on the unused NVMe {sug['drive']} (fstab by UUID)",
                           detail="\n".join(detail), evidence=[Evidence.note("fstab line", line)], remedies=remedies)]
    if st is not None:
        m = st.get("mount") or {}
        ident = st.get("filesystem") or {}
        if m and m.get("point") != "/" and not st.get("in_fstab") and m.get("fit") and ident.get("uuid"):
            line = fs.fstab_line(ident["uuid"], m["point"], m["fstype"])
            return [me.finding(status="warn",
                            title=f"{m['point']} is mounted but not in fstab: gone after a reboot",
                            detail=f"{m['source']} was mounted by hand; after a reboot nvme_path would point into an "
                                   f"empty directory on the root disk. Add it by UUID: {line}",
                            evidence=[Evidence.note("fstab line", line)],
                            remedies=[fs.fstab_remedy(ident["uuid"], m["point"], m["fstype"], mount_now=False)])]
        return [me.finding(status="ok", title="fstab: nothing to change for offload",
                           detail=f"{m.get('point') or st['path']} " + ("is in fstab." if st.get("in_fstab") else
                                                                        "needs no fstab entry.")
                           + ("" if sug else " No unused NVMe drive to add."))]
    return [me.not_checked(facts.why_not("storage") + "; no unused NVMe drive to suggest.")]


# -------------------------------------------------------------------------------------------- predicates
@predicate("offload_path_missing", doc="no offload path was given (neither --offload-path nor an nvme_path in the "
           "ds_config), or the path does not exist", probes=("storage",))
def offload_path_missing(facts: Facts) -> bool:
    res = facts.get("storage")
    if res is None:
        return False
    if res.status == "skip":
        return True
    return res.status == "ok" and res.facts.get("exists") is False  # None: a recorded node, not looked at


@predicate("offload_path_unfit", doc="the offload path's file system cannot hold DeepSpeed's swap files (tmpfs, "
           "ramfs, overlay, NFS, FUSE, read-only ...) or O_DIRECT fails there", probes=("storage",))
def offload_path_unfit(facts: Facts) -> bool:
    st = facts.of("storage")
    if st is None:
        return False
    m = st.get("mount") or {}
    return (bool(m) and not m.get("fit")) or (st.get("odirect") or {}).get("ok") is False \
        or bool(st.get("fstab_unmounted"))


@predicate("offload_on_slow_device", doc="the offload path is on a rotational, SATA, USB/SD, network or RAM-backed "
           "device, or measured slower than 1 GB/s", probes=("storage",))
def offload_on_slow_device(facts: Facts) -> bool:
    st = facts.of("storage")
    if st is None:
        return False
    measured = _slowest(st)
    if measured is not None:
        return measured < SLOW_BPS
    return (st.get("device") or {}).get("speed_class") in ("slow", "medium", "ram") or \
        bool((st.get("mount") or {}).get("network"))


@predicate("unmounted_nvme_present", doc="a local NVMe drive is present with nothing of it mounted or used as swap",
           probes=("nvme_inventory",))
def unmounted_nvme_present(facts: Facts) -> bool:
    inv = facts.of("nvme_inventory")
    return bool(inv and _usable(inv))
