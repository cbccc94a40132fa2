"""Probes ``storage`` and ``nvme_inventory``: where NVMe offload writes, what is under it, how fast it is,
and which NVMe drives sit unused.

``storage`` looks at the offload path: ``host.options["offload_path"]``, else the ``nvme_path`` of the
ds_config (``zero_optimization.offload_optimizer`` first, then ``offload_param``); without either it is
skipped. The throughput test writes a file, so it runs only when asked: ``--io-size SIZE`` (not 0), or
``--offload-path`` given explicitly (then at most 1 GiB and at most a tenth of the free space);
``--io-size 0`` turns it off. A path taken from the ds_config alone gets every other check but no write.
A host may carry ``io_progress(phase, done_bytes, total_bytes)`` to draw a progress bar.

``storage`` facts (plain JSON):

- ``path``, ``source`` (``--offload-path`` | ``ds_config <key>``), ``explicit`` (given on the command line),
  ``config_paths`` [{key, path, device}] and ``ds_config_error`` from the ds_config.
- ``exists``, ``is_dir``, ``probed_path`` (the path, or its nearest existing parent).
- ``mount``: {point, fstype, source, majmin, root, options, super_options, noatime, readonly, network, fit,
  unfit_reason} | None; ``space``: {total_bytes, free_bytes, avail_bytes} | None.
- ``in_fstab``: the fstab entry for the mount point (or None); ``fstab_unmounted``: fstab entries meant to
  hold the path with nothing mounted on them; ``fstab_path``.
- ``device``: blockdev.device_info of the mount's source (kind, effective_kind, speed_class, stack, disks,
  model, nvme.link {current_gts, current_width, generation, theoretical_bps, downtrained ...}, loop ...)
  or None; ``device_error``; ``filesystem``: {uuid, type, sources, agree} of that source.
- ``access``: {uid, gid, owner, group, mode, writable (by zdoctor), user_writable (by the training user)};
  ``user``: {name, group} (who runs training: the sudo caller under sudo, else the current user).
- ``odirect``: {ok (True|False|None), stage, errno, error, tested_in}.
- ``libaio``: {ok, runtime, header, dev_library, link_test {ran, ok, compiler, error}, package, install, distro}.
- ``throughput``: {ran: False, reason} or iotest.measure's result plus ``link_bps`` and ``ratio``.

``nvme_inventory`` facts: ``drives`` [{name, path, size_bytes, model, serial, kind, link, partitions,
holders, uses, filesystems, state (in-use | member | has-filesystem | blank | unknown), reason,
unmounted}], ``unmounted`` [names], ``suggestion`` (the drive to use for offload: {drive, device,
mountpoint, fstype, uuid, needs_mkfs, offload_dir}) or None.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.factstypes import NvmeInventoryFacts, StorageFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.offload import blockdev as bd
from zdoctor.layers.offload import fstab as fs
from zdoctor.layers.offload import iotest as io
from zdoctor.layers.offload.dsconfig import load_config
from zdoctor.layers.python_env.probe_pyenv import TARGET_TIMEOUT
from zdoctor.proc.target import target_of
from zdoctor.proc.trainuser import account, env_prefix, training_user  # noqa: F401 - the probes' training user
from zdoctor.readers import mounts as mt

#: Each throughput phase stops after this many seconds; the probe's budget covers both and the rest.
IO_TIME_LIMIT = 45.0
STORAGE_TIMEOUT = 2 * IO_TIME_LIMIT + 60
CONFIG_KEYS = ("offload_optimizer", "offload_param")


def config_paths(ds_config: str) -> tuple[list[dict[str, Any]], str | None]:
    """The ``nvme_path`` entries of a ds_config, read as DeepSpeed reads it (HJSON)."""

    try:  # the one bounded reader: a regular file under the size cap, UTF-8, depth and digits bounded
        doc = load_config(ds_config).data
    except InputError as exc:
        return [], str(exc)
    zero = doc.get("zero_optimization") if isinstance(doc, dict) else None
    out = []
    for key in CONFIG_KEYS:
        sect = zero.get(key) if isinstance(zero, dict) else None
        if isinstance(sect, dict) and isinstance(sect.get("nvme_path"), str) and sect["nvme_path"].strip():
            out.append({"key": f"zero_optimization.{key}.nvme_path", "path": os.path.abspath(sect["nvme_path"]),
                        "device": sect.get("device") if isinstance(sect.get("device"), str) else None})
    return out, None


def offload_target(options: dict[str, Any]) -> dict[str, Any]:
    """Which path to examine and why: {path, source, explicit, config_paths, ds_config_error}."""
    paths, err = config_paths(str(options["ds_config"])) if options.get("ds_config") else ([], None)
    out: dict[str, Any] = {"path": None, "source": None, "explicit": False, "config_paths": paths,
                           "ds_config_error": err}
    if options.get("offload_path"):
        out.update(path=os.path.abspath(str(options["offload_path"])), source="--offload-path", explicit=True)
    else:
        nvme = [p for p in paths if p["device"] == "nvme"] or paths
        if nvme:
            out.update(path=nvme[0]["path"], source=f"ds_config {nvme[0]['key']}")
    return out


def access(path: str, user: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Owner, group and mode of ``path``; ``writable`` for zdoctor itself and ``user_writable`` for the
    training user (from the mode bits and the user's groups; None when the user is unknown)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    mode = stat.S_IMODE(st.st_mode)
    user_writable = None
    try:
        pw = pwd.getpwnam((user or {}).get("name") or "")
        groups = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
        if pw.pw_uid == 0:
            user_writable = True
        elif pw.pw_uid == st.st_uid:
            user_writable = bool(mode & 0o300 == 0o300)
        elif st.st_gid in groups:
            user_writable = bool(mode & 0o030 == 0o030)
        else:
            user_writable = bool(mode & 0o003 == 0o003)
    except (KeyError, OSError):
        pass
    return {"uid": st.st_uid, "gid": st.st_gid, "owner": owner, "group": group, "mode": f"{mode:04o}",
            "writable": os.access(path, os.W_OK | os.X_OK), "user_writable": user_writable}


def _loop_resolver(entries: list[mt.MountEntry], tree: bd.SysTree, live: bool):
    """Describe the device under a loop device's backing file (the file's own mount)."""
    def resolve(backing: str) -> dict[str, Any] | None:
        m = mt.mount_for(mt.existing_ancestor(backing) if live else backing, entries, resolve=live)
        k = bd.kname_for_mount(tree, m, live=live) if m else None
        return bd.device_info(k, tree=tree, loop_resolver=resolve) if k else None
    return resolve


def _mount_table(facts: dict[str, Any]) -> Evidence:
    m = facts.get("mount") or {}
    dev = facts.get("device") or {}
    sp = facts.get("space") or {}
    rows = [["offload path", facts["path"] + (" (does not exist)" if facts.get("exists") is False else "")],
            ["mount point", m.get("point", "?")], ["file system", m.get("fstype", "?")],
            ["mounted from", m.get("source", "?")], ["options", ",".join(m.get("options") or [])],
            ["device", bd.describe_device(dev) if dev else facts.get("device_error") or "none"],
            ["filesystem UUID", (facts.get("filesystem") or {}).get("uuid") or "unknown"],
            ["free", f"{io.human(sp.get('avail_bytes'))} of {io.human(sp.get('total_bytes'))}" if sp else "?"]]
    hl = [i for i, r in enumerate(rows) if r[0] == "file system" and not m.get("fit", True)]
    return Evidence.of_table("where offload writes", ["", "value"], rows, hl)


def collect_storage(path: str, *, source: str = "--offload-path", explicit: bool = True,
                    io_size: str | None = None, env: dict[str, str] | None = None, progress=None,
                    sysfs_root: str = "/sys", dev_root: str = "/dev", udev_root: str = "/run/udev",
                    mountinfo: str = mt.MOUNTINFO, fstab_path: str = fs.FSTAB, live: bool = True,
                    io_time_limit: float = IO_TIME_LIMIT, user: dict[str, str] | None = None,
                    ds_location: str | None = None) -> tuple[dict[str, Any], list[Evidence]]:
    """The ``storage`` facts for ``path`` (see the module docstring).

    ``live=False`` reads a recorded node (the roots and files given) and looks at nothing on this
    machine: access, O_DIRECT, libaio and throughput are then left out (None)."""
    facts: dict[str, Any] = mt.path_mount(path, mountinfo, live=live)
    facts.update(source=source, explicit=explicit, fstab_path=fstab_path, device=None, device_error=None,
                 filesystem=None, access=None, odirect=None, libaio=None,
                 throughput={"ran": False, "reason": "a recorded node: nothing was measured"})
    evidence: list[Evidence] = []
    entries = mt.read_mountinfo(mountinfo)
    tree = bd.SysTree(sysfs_root)
    m = mt.mount_for(facts["probed_path"], entries, resolve=live)
    fstab_entries = fs.read_fstab(fstab_path)
    facts["fstab_unmounted"] = [e.to_dict() for e in fs.unmounted_entries(fstab_entries, path, entries)]
    facts["in_fstab"] = next((e.to_dict() for e in fstab_entries
                              if m and (e.file.rstrip("/") or "/") == (m.point.rstrip("/") or "/")), None)
    if m:
        kname = bd.kname_for_mount(tree, m, live=live)
        if kname:
            facts["device"] = bd.device_info(kname, tree=tree, loop_resolver=_loop_resolver(entries, tree, live))
            ident, evs = bd.fs_identity(kname, facts["device"].get("majmin"), dev_root=dev_root,
                                        udev_root=udev_root, use_blkid=live)
            facts["filesystem"] = ident
            evidence.extend(evs)
        else:
            facts["device_error"] = f"{m.source} ({m.fstype}) is not a block device"
    facts["user"] = user if user is not None else training_user(env)
    if live:
        probed = facts["probed_path"]
        facts["access"] = access(probed, facts["user"])
        probed_dir = probed if os.path.isdir(probed) else os.path.dirname(probed)
        facts["odirect"] = io.odirect_check(probed_dir)
        facts["libaio"], evs = io.libaio_status(env, ds_location=ds_location)
        evidence.extend(evs)
        facts["throughput"] = _throughput(facts, probed_dir, io_size, explicit, progress, io_time_limit)
    evidence.insert(0, _mount_table(facts))
    return facts, evidence


def _throughput(facts: dict[str, Any], directory: str, io_size: str | None, explicit: bool, progress,
                time_limit: float) -> dict[str, Any]:
    """Run the throughput test when it was asked for and is safe to run; else say why not."""
    if io_size is None and not explicit:
        return {"ran": False, "reason": "not asked for: the path came from the ds_config; pass --io-size SIZE "
                                        "(or --offload-path) to measure"}
    try:
        requested = io.parse_size(io_size) if io_size is not None else None
    except InputError as exc:
        return {"ran": False, "reason": str(exc)}
    if facts["odirect"].get("ok") is not True:
        return {"ran": False, "reason": "O_DIRECT does not work there, so the test (like DeepSpeed) cannot run"}
    if not (facts.get("mount") or {}).get("fit", False):
        return {"ran": False, "reason": "the file system is not fit for offload; not measured"}
    size, why = io.plan_size(requested, (facts.get("space") or {}).get("avail_bytes"))
    if not size:
        return {"ran": False, "reason": why}
    res = io.measure(directory, size, time_limit=time_limit, progress=progress)
    link = ((facts.get("device") or {}).get("nvme") or {}).get("link") or {}
    res["link_bps"] = link.get("theoretical_bps")
    slowest = min((p["bps"] for p in (res.get("write"), res.get("read")) if p and p.get("bps")), default=None)
    res["ratio"] = slowest / res["link_bps"] if slowest and res["link_bps"] else None
    return res


def _deepspeed_location(host: Any) -> str | None:
    """Where the training interpreter's DeepSpeed is installed (the pyenv probe), for its csrc/aio sources."""
    try:
        res = host.result("pyenv")
    except Exception:  # noqa: BLE001 - without it the libaio test makes libaio's basic calls
        return None
    loc = ((res.facts or {}).get("deepspeed") or {}).get("location") if res.status == "ok" else None
    return loc if isinstance(loc, str) else None


@probe("storage", title="Offload storage: mount, device, O_DIRECT, libaio, throughput",
       timeout=STORAGE_TIMEOUT + TARGET_TIMEOUT + 30, needs=("pyenv",), facts=StorageFacts)
def storage_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    """The offload path's mount and device, O_DIRECT, libaio, and (when asked) its throughput."""
    options = dict(target_of(host).options)
    target = offload_target(options)
    job = target_of(host)
    env = dict(job.env)
    user = training_user(env, user=str(options["user"]) if options.get("user") else None,
                         python=job.python, python_explicit=job.python_explicit)
    if not target["path"]:
        why = ("no offload path: pass --offload-path DIR, or --ds-config with an nvme_path"
               if not target["ds_config_error"] else f"no offload path ({target['ds_config_error']})")
        return {"skipped": why, **target, "user": user}, []
    io_size = options.get("io_size")
    facts, evidence = collect_storage(target["path"], source=target["source"], explicit=target["explicit"],
                                      io_size=None if io_size is None else str(io_size), env=env,
                                      progress=getattr(host, "io_progress", None), user=user,
                                      ds_location=_deepspeed_location(host))
    facts.update(config_paths=target["config_paths"], ds_config_error=target["ds_config_error"])
    return facts, evidence


#: File systems offload may use as they are (anything else on an unused drive is left alone).
GOOD_FS = ("ext4", "xfs", "btrfs", "f2fs")


def suggest(drives: list[dict[str, Any]], *, mnt_root: str = "/mnt", mountinfo: list[mt.MountEntry] | None = None,
            uuid: str | None = None, live: bool = True) -> dict[str, Any] | None:
    """The unused drive to put offload on (fastest link, then largest; blank, or carrying an ext4/xfs/
    btrfs/f2fs filesystem), where to mount it and whether it must be formatted first."""
    def candidate(d: dict[str, Any]) -> tuple[str, str | None, str | None] | None:
        if d["state"] == "blank":
            return d["name"], None, None
        if d["state"] != "has-filesystem":
            return None
        fsys = d.get("filesystems") or {}
        good = [(k, v) for k, v in fsys.items() if v.get("type") in GOOD_FS and v.get("uuid")]
        good.sort(key=lambda kv: kv[0] == d["name"])  # a partition before the whole disk
        return (good[0][0], good[0][1]["type"], good[0][1]["uuid"]) if good else None

    usable = [(d, c) for d in drives if d.get("kind") == "nvme" and (c := candidate(d))]
    if not usable:
        return None
    best, (kname, fstype, fs_uuid) = max(
        usable, key=lambda dc: ((dc[0].get("link") or {}).get("theoretical_bps") or 0.0, dc[0].get("size_bytes") or 0))
    points = {m.point for m in mountinfo or []}
    mp = os.path.join(mnt_root, "nvme")
    if mp in points or (live and os.path.isdir(mp) and os.listdir(mp)):
        mp = os.path.join(mnt_root, f"nvme-{best['name']}")
    mkfs = best["state"] == "blank"
    return {"drive": best["name"], "device": os.path.join(os.path.dirname(best["path"]), kname), "mountpoint": mp,
            "fstype": "ext4" if mkfs else fstype, "uuid": (uuid or fs.new_uuid()) if mkfs else fs_uuid,
            "needs_mkfs": mkfs, "offload_dir": os.path.join(mp, "zero-offload")}


def collect_inventory(*, sysfs_root: str = "/sys", dev_root: str = "/dev", udev_root: str = "/run/udev",
                      mountinfo: str = mt.MOUNTINFO, swaps: str = "/proc/swaps", mnt_root: str = "/mnt",
                      live: bool = True) -> tuple[dict[str, Any], list[Evidence]]:
    """The ``nvme_inventory`` facts (see the module docstring); ``live=False`` for a recorded node (no
    blkid, no look at this machine's /dev or /mnt)."""
    entries = mt.read_mountinfo(mountinfo)
    try:
        with open(swaps, encoding="utf-8", errors="replace") as fh:
            swap_list = bd.parse_swaps(fh.read())
    except OSError:
        swap_list = []
    drives, evidence = bd.nvme_inventory(sysfs_root, mounts=entries, swaps=swap_list, dev_root=dev_root,
                                         udev_root=udev_root, use_blkid=live, live=live)
    rows, hl = [], []
    for i, d in enumerate(drives):
        if d["unmounted"]:
            hl.append(i)
        rows.append([d["name"], io.human(d.get("size_bytes")), d.get("model") or "?", bd.link_label(d.get("link")),
                     d["state"], d["reason"]])
    table = Evidence.of_table("NVMe drives", ["drive", "size", "model", "link", "state", "why"], rows, hl)
    facts = {"drives": drives, "unmounted": [d["name"] for d in drives if d["unmounted"]],
             "suggestion": suggest(drives, mnt_root=mnt_root, mountinfo=entries, live=live)}
    return facts, [table, *evidence]


@probe("nvme_inventory", title="NVMe drives present and unused", timeout=60.0, facts=NvmeInventoryFacts)
def nvme_inventory_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    """Every NVMe namespace, what uses it, and which one offload could move to."""
    return collect_inventory()
