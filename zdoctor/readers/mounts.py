"""The one reader of the mount table and the one classifier of file systems: the mount holding a path
(point, file system, options, source device), its space, and whether it is network, memory, a container
layer, FUSE or a block device, and fit for offload's O_DIRECT swap files. Every check that asks where a path
lives asks here, so they cannot judge the same path differently."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.proc.userfile import read_system_table

MOUNTINFO = "/proc/self/mountinfo"

_ESCAPE = re.compile(r"\\([0-7]{3})")

#: File systems DeepSpeed's NVMe offload must not use, and why.
UNFIT_FS: dict[str, str] = {
    "tmpfs": "tmpfs lives in RAM (and swap): offloading to it spends the very memory offload is meant to free",
    "ramfs": "ramfs lives in RAM, cannot be limited and does not support O_DIRECT",
    "devtmpfs": "devtmpfs is the kernel's /dev, not storage",
    "overlay": "overlayfs is a container's copy-on-write layer: writes go through copy-up into container "
               "storage that disappears with the container, and O_DIRECT support depends on the layers",
    "aufs": "aufs is a container's union layer, not a disk",
    "squashfs": "squashfs is a read-only image",
    "vfat": "FAT cannot hold a file over 4 GiB and has no ownership or permissions",
    "msdos": "FAT cannot hold a file over 4 GiB and has no ownership or permissions",
    "iso9660": "a read-only optical image",
    "nfs": "NFS sends every swap block over the network (and O_DIRECT over NFS is synchronous per request)",
    "nfs4": "NFS sends every swap block over the network (and O_DIRECT over NFS is synchronous per request)",
    "cifs": "SMB/CIFS sends every swap block over the network",
    "smb3": "SMB sends every swap block over the network",
    "smbfs": "SMB sends every swap block over the network",
    "9p": "9p is a host/guest file share, far slower than a local disk",
    "virtiofs": "virtiofs is a host/guest file share; its speed and O_DIRECT support depend on the host",
    "fuse": "FUSE file systems run in user space and rarely support O_DIRECT at disk speed",
    "proc": "not storage",
    "sysfs": "not storage",
    "cgroup2": "not storage",
}

#: File systems whose data crosses a network (or a host/guest share): shared and parallel file systems,
#: network shares, and the FUSE clients of them. A lock there may be held by a process on another machine.
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "afs", "lustre", "gpfs", "beegfs", "ceph",
              "glusterfs", "wekafs", "panfs", "ocfs2", "gfs2")
NETWORK_FUSE = ("fuse.sshfs", "fuse.glusterfs", "fuse.cephfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone")
MEMORY_FS = ("tmpfs", "ramfs")
PROC_MOUNTS = "/proc/self/mounts"


def unescape(text: str) -> str:
    """Decode mountinfo/fstab octal escapes (``\\040`` space, ``\\011`` tab, ``\\012`` newline,
    ``\\134`` backslash)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


@dataclass
class MountEntry:
    """One line of ``/proc/self/mountinfo``."""

    mount_id: int
    parent_id: int
    majmin: str  # "259:1"; anonymous ("0:42") for btrfs subvolumes, overlay, tmpfs ...
    root: str  # the directory of the file system mounted here (bind mounts, btrfs subvolumes)
    point: str
    options: list[str]
    fstype: str
    source: str
    super_options: list[str] = field(default_factory=list)
    optional: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Every well-formed line of mountinfo text, in order (later lines are mounted on top)."""
    out: list[MountEntry] = []
    for line in text.splitlines():
        parts = line.split(" ")
        if "-" not in parts:
            continue
        sep = parts.index("-")
        head, tail = parts[:sep], parts[sep + 1:]
        if len(head) < 6 or len(tail) < 2:
            continue
        try:
            mid, pid = int(head[0]), int(head[1])
        except ValueError:
            continue
        out.append(MountEntry(
            mount_id=mid, parent_id=pid, majmin=head[2], root=unescape(head[3]), point=unescape(head[4]),
            options=head[5].split(","), optional=head[6:], fstype=tail[0],
            source=unescape(tail[1]), super_options=tail[2].split(",") if len(tail) > 2 else []))
    return out


def parse_proc_mounts(text: str) -> list[MountEntry]:
    """Every well-formed line of ``/proc/mounts`` text (``source point fstype options dump pass``), in order;
    the fields mountinfo has and this format lacks are left empty."""
    out: list[MountEntry] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        out.append(MountEntry(mount_id=0, parent_id=0, majmin="", root="/", point=unescape(parts[1]),
                              options=parts[3].split(","), fstype=parts[2], source=unescape(parts[0])))
    return out


def parse_mount_table(text: str) -> list[MountEntry]:
    """Mountinfo text or ``/proc/mounts`` text, told apart by mountinfo's `` - `` separator."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    return parse_mountinfo(text) if " - " in first else parse_proc_mounts(text)


def read_mountinfo(path: str = MOUNTINFO) -> list[MountEntry]:
    """Parse the mount table at ``path``, mountinfo or ``/proc/mounts`` format (empty list when it cannot
    be read)."""
    text = read_system_table(path)
    return [] if text is None else parse_mount_table(text)


def existing_ancestor(path: str) -> str:
    """``path`` itself when it exists, else its nearest existing parent directory."""
    cur = os.path.abspath(path)
    while not os.path.lexists(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    return cur


def mount_for(path: str, mounts: list[MountEntry], *, resolve: bool = True) -> MountEntry | None:
    """The mount holding ``path``: the longest mount point that is a prefix of its real path; among
    equal points the last one (a mount stacked on top hides those below)."""
    real = os.path.realpath(path) if resolve else os.path.abspath(path)
    best: MountEntry | None = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        inside = real == point or point == "/" or real.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def mount_at(point: str, mounts: list[MountEntry]) -> MountEntry | None:
    """The mount active at exactly ``point`` (the last one there: a mount stacked on top hides those below)."""
    found = None
    for m in mounts:
        if m.point == point:
            found = m
    return found


def mount_of(path: str, table: str = MOUNTINFO) -> dict[str, Any] | None:
    """The mount holding ``path`` read from the mount table at ``table`` (mountinfo or /proc/mounts), as
    ``{point, fstype, source, dev, options}``; None when the table cannot be read or nothing holds it."""
    m = mount_for(path, read_mountinfo(table))
    if m is None:
        return None
    return {"point": m.point, "fstype": m.fstype, "source": m.source, "dev": m.majmin, "options": ",".join(m.options)}


def is_network_fs(fstype: str | None) -> bool:
    """Whether data on this file system crosses a network (see :data:`NETWORK_FS`)."""
    if not fstype:
        return False
    return fstype in NETWORK_FS or fstype.split(".")[0] in NETWORK_FS or fstype in NETWORK_FUSE


def fs_category(fstype: str | None, source: str | None) -> str:
    """memory | overlay | fuse | network | block | other | unknown. A FUSE client of a network store
    (fuse.sshfs, fuse.s3fs ...) is ``fuse``, what O_DIRECT meets first; :func:`is_network_fs` still says it
    crosses a network."""
    if not fstype:
        return "unknown"
    base = fstype.split(".")[0]
    if fstype in MEMORY_FS:
        return "memory"
    if fstype == "overlay":
        return "overlay"
    if base == "fuse" or fstype == "fuseblk" and not (source or "").startswith("/dev/"):
        return "fuse"
    if is_network_fs(fstype):
        return "network"
    if (source or "").startswith("/dev/"):
        return "block"
    return "other"


def fitness(m: MountEntry) -> tuple[bool, str | None]:
    """Whether DeepSpeed's swap files may live on this mount, and why not."""
    base = m.fstype.split(".")[0]
    if m.fstype in UNFIT_FS:
        return False, UNFIT_FS[m.fstype]
    if base == "fuse" or m.fstype.startswith("fuse."):
        return False, f"{m.fstype}: " + UNFIT_FS["fuse"]
    if "ro" in m.options or "ro" in m.super_options:
        return False, f"{m.point} is mounted read-only"
    return True, None


def describe(m: MountEntry) -> dict[str, Any]:
    """The facts recorded for a mount."""
    fit, why = fitness(m)
    return {
        "point": m.point,
        "fstype": m.fstype,
        "source": m.source,
        "majmin": m.majmin,
        "root": m.root,
        "options": m.options,
        "super_options": m.super_options,
        "noatime": "noatime" in m.options,
        "readonly": "ro" in m.options or "ro" in m.super_options,
        "network": is_network_fs(m.fstype),
        "fit": fit,
        "unfit_reason": why,
    }


def space(path: str) -> dict[str, int] | None:
    """Free, available (to non-root users) and total bytes of the file system holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bfree * st.f_frsize,
            "avail_bytes": st.f_bavail * st.f_frsize}


def path_mount(path: str, mountinfo: str = MOUNTINFO, *, live: bool = True) -> dict[str, Any]:
    """Everything about where ``path`` lives: the path probed (the nearest existing ancestor when the
    path does not exist yet), the mount, and the space. With ``live=False`` (a recorded mountinfo) the
    path is taken as written and nothing on this machine is looked at (exists/space are None)."""
    entries = read_mountinfo(mountinfo)
    if not live:
        p = os.path.abspath(path)
        m = mount_for(p, entries, resolve=False)
        return {"path": p, "exists": None, "is_dir": None, "probed_path": p,
                "mount": describe(m) if m else None, "space": None}
    probed = existing_ancestor(path)
    m = mount_for(probed, entries)
    return {
        "path": os.path.abspath(path),
        "exists": os.path.exists(path),
        "is_dir": os.path.isdir(path),
        "probed_path": probed,
        "mount": describe(m) if m else None,
        "space": space(probed),
    }
