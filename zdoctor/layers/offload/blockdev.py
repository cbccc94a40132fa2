"""The block device under a mount, from sysfs: through partitions, device-mapper/LVM, md RAID and loop
devices down to the disks, what kind each disk is, and how fast its link is.

Every read goes through :class:`SysTree`, rooted at ``sysfs_root`` (``/sys`` on a live machine, a
recorded tree in tests and replays). A :class:`SysTree` in recording mode remembers every file, link
and directory it touched, and :meth:`SysTree.manifest` writes them out in the format
:func:`build_tree` turns back into a directory tree: the way a real node's tree is captured.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

from zdoctor.core.model import Evidence
from zdoctor.proc import runner
from zdoctor.readers.mounts import MountEntry

SECTOR = 512
_NVME_NS = re.compile(r"^nvme(\d+)n(\d+)$")
_NVME_PATH = re.compile(r"^nvme\d+c\d+n\d+$")  # hidden per-controller paths of a multipath namespace
_GTS = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*GT/s")

#: PCIe transfer rate (GT/s per lane) -> generation.
PCIE_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}

#: NVMe models that are network volumes presented as PCIe NVMe (cloud block storage), not local flash.
NETWORK_NVME_MODELS = ("Amazon Elastic Block Store", "nvme_card-pd")

#: kind -> speed class (what it means for offload); loop/md/dm take their members' class.
SPEED_CLASS = {"nvme": "fast", "ram": "ram", "ssd": "medium", "hdd": "slow", "usb": "slow", "mmc": "slow",
               "network": "slow", "virtio": "unknown", "virtual": "unknown", "unknown": "unknown"}
_CLASS_RANK = {"slow": 0, "unknown": 1, "medium": 2, "fast": 3, "ram": 4}

MAX_DEPTH = 8


class SysTree:
    """Reads a sysfs-like tree under ``root``; symlinks resolve inside the tree.

    With ``record=True`` it remembers what it read so :meth:`manifest` can reproduce exactly that.
    """

    def __init__(self, root: str = "/sys", record: bool = False) -> None:
        self.root = os.path.abspath(root)
        self.record = record
        self._files: dict[str, str] = {}
        self._links: dict[str, str] = {}
        self._dirs: set[str] = set()

    def rel(self, path: str) -> str:
        """``path`` relative to the tree root ("" for the root itself)."""
        p = os.path.relpath(path, self.root)
        return "" if p == "." else p

    def real(self, path: str) -> str:
        """``path`` with every symlink resolved, never leaving the tree (an escaping link resolves to a
        path that does not exist)."""
        parts = [p for p in self.rel(os.path.join(self.root, path)).split("/") if p]
        done: list[str] = []
        hops = 0
        while parts:
            head = parts.pop(0)
            if head == "..":
                if done:
                    done.pop()
                continue
            cand = "/".join(done + [head])
            full = os.path.join(self.root, cand)
            if os.path.islink(full) and hops < 40:
                hops += 1
                target = os.readlink(full)
                if self.record:
                    self._links[cand] = target
                base = [] if target.startswith("/") else list(done)
                parts = [p for p in target.split("/") if p and p != "."] + parts
                done = base
                continue
            done.append(head)
        return os.path.join(self.root, *done) if done else self.root

    def read(self, path: str) -> str | None:
        """The first line of a file, stripped; None when absent or unreadable."""
        real = self.real(path)
        try:
            with open(real, encoding="utf-8", errors="replace") as fh:
                text = fh.read(4096)
        except OSError:
            return None
        value = text.splitlines()[0].strip() if text.strip() else ""
        if self.record:
            self._files[self.rel(real)] = value
        return value

    def listdir(self, path: str) -> list[str]:
        real = self.real(path)
        try:
            names = sorted(os.listdir(real))
        except OSError:
            return []
        if self.record:
            self._dirs.add(self.rel(real))
            for n in names:  # links and dirs are what listings are for; files are kept when read
                full = os.path.join(real, n)
                if os.path.islink(full):
                    self._links[self.rel(full)] = os.readlink(full)
                elif os.path.isdir(full):
                    self._dirs.add(self.rel(full))
        return names

    def isdir(self, path: str) -> bool:
        real = self.real(path)
        ok = os.path.isdir(real)
        if ok and self.record:
            self._dirs.add(self.rel(real))
        return ok

    def exists(self, path: str) -> bool:
        real = self.real(path)
        ok = os.path.exists(real)
        if ok and self.record and not self.isdir(real):  # a directory is recorded as one, a file with its line
            self.read(real)
        return ok

    def manifest(self, prefix: str = "") -> str:
        """What was read, as :func:`build_tree` input; ``prefix`` is prepended to every path (``sys``)."""
        def p(rel: str) -> str:
            return "/".join(x for x in (prefix, rel) if x)

        lines = [f"{p(d)}/" for d in sorted(self._dirs) if d]
        lines += [f"{p(k)} -> {v}" for k, v in sorted(self._links.items())]
        lines += [f"{p(k)} = {encode_value(v)}" for k, v in sorted(self._files.items())]
        return "\n".join(lines) + "\n"


_VALUE_ESCAPE = re.compile(r"\\([\\nt])")


def encode_value(value: str) -> str:
    r"""A file's text for one manifest line: backslash, newline and tab as ``\\``, ``\n``, ``\t``."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def decode_value(text: str) -> str:
    r"""The inverse of :func:`encode_value`; any other backslash (``\\040``) stays as it is."""
    return _VALUE_ESCAPE.sub(lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def build_tree(manifest: str, root: str) -> str:
    """Create the tree a manifest describes under ``root``: ``path/`` a directory, ``path -> target`` a
    symlink, ``path = value`` a file holding ``value`` (see :func:`decode_value`) and a newline; ``#``
    starts a comment. Paths are relative and may not climb out of ``root``."""
    for n, line in enumerate(manifest.splitlines(), 1):
        line = line.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if " -> " in line:
            path, target = line.split(" -> ", 1)
            kind = "link"
        elif " = " in line or line.endswith(" ="):
            path, _, target = line.partition(" =")
            target = target[1:] if target.startswith(" ") else target
            kind = "file"
        elif line.endswith("/"):
            path, target, kind = line.rstrip("/"), "", "dir"
        else:
            raise ValueError(f"manifest line {n}: expected 'path/', 'path -> target' or 'path = value'")
        path = path.strip()
        if path.startswith("/") or ".." in path.split("/"):
            raise ValueError(f"manifest line {n}: path must stay inside the tree: {path!r}")
        full = os.path.join(root, path)
        os.makedirs(full if kind == "dir" else os.path.dirname(full), exist_ok=True)
        if kind == "link":
            if os.path.lexists(full):
                os.unlink(full)
            os.symlink(target, full)
        elif kind == "file":
            with open(full, "w", encoding="utf-8") as fh:
                fh.write(decode_value(target) + "\n")
    return root


# -- PCIe links --------------------------------------------------------------------------------------

def parse_link_speed(text: str | None) -> float | None:
    """``"16.0 GT/s PCIe"`` (or older kernels' ``"8 GT/s"``) -> 16.0; None for ``Unknown``."""
    m = _GTS.search(text or "")
    return float(m.group(1)) if m else None


def pcie_generation(gts: float | None) -> int | None:
    return PCIE_GEN.get(gts) if gts is not None else None


def encoding_efficiency(gts: float) -> float:
    """Payload share of the line rate: 8b/10b up to Gen2, 128b/130b for Gen3-5, FLIT (about 242/256)
    for Gen6."""
    if gts <= 5.0:
        return 8 / 10
    if gts <= 32.0:
        return 128 / 130
    return 242 / 256


def link_rate(gts: float | None, width: int | None) -> float | None:
    """Theoretical one-direction payload rate of a PCIe link, bytes/s (before protocol overhead)."""
    if not gts or not width:
        return None
    return gts * 1e9 * encoding_efficiency(gts) * width / 8


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def link_info(tree: SysTree, pci_dir: str) -> dict[str, Any] | None:
    """The PCIe link of a PCI function: current and maximum speed and width, generation, rates."""
    cur_s, max_s = tree.read(f"{pci_dir}/current_link_speed"), tree.read(f"{pci_dir}/max_link_speed")
    cur_w, max_w = _int(tree.read(f"{pci_dir}/current_link_width")), _int(tree.read(f"{pci_dir}/max_link_width"))
    if cur_s is None and max_s is None:
        return None
    cur_g, max_g = parse_link_speed(cur_s), parse_link_speed(max_s)
    return {
        "pci": os.path.basename(pci_dir),
        "current_speed": cur_s, "current_gts": cur_g, "current_width": cur_w,
        "max_speed": max_s, "max_gts": max_g, "max_width": max_w,
        "generation": pcie_generation(cur_g), "max_generation": pcie_generation(max_g),
        "theoretical_bps": link_rate(cur_g, cur_w),
        "max_theoretical_bps": link_rate(max_g, max_w),
        "downtrained": bool((cur_g and max_g and cur_g < max_g) or (cur_w and max_w and cur_w < max_w)),
    }


def link_label(link: dict[str, Any] | None) -> str:
    """``"PCIe Gen4 x4 (7.88 GB/s)"``; ``"unknown link"`` when there is none."""
    if not link or not link.get("current_gts"):
        return "unknown link"
    gen = link.get("generation")
    g = f"Gen{gen}" if gen else f"{link['current_gts']:g} GT/s"
    rate = link.get("theoretical_bps")
    return f"PCIe {g} x{link.get('current_width') or '?'}" + (f" ({rate / 1e9:.2f} GB/s)" if rate else "")


# -- devices -------------------------------------------------------------------------------------------

def nvme_controllers(tree: SysTree, disk_dir: str) -> list[str]:
    """Controller dirs of an NVMe namespace: its ``device`` (a controller, or with native multipath the
    subsystem, whose ``nvmeN`` entries are the controllers), else ``class/nvme/nvmeN`` by name."""
    out: list[str] = []
    dev = f"{disk_dir}/device"
    if tree.exists(dev):
        real = tree.real(dev)
        if tree.exists(f"{real}/transport"):
            out.append(real)
        elif tree.exists(f"{real}/subsysnqn"):
            for name in tree.listdir(real):
                if re.fullmatch(r"nvme\d+", name) and tree.exists(f"{real}/{name}/transport"):
                    out.append(tree.real(f"{real}/{name}"))
    if not out:
        m = _NVME_NS.match(os.path.basename(disk_dir))
        if m:
            cand = os.path.join(tree.root, "class", "nvme", f"nvme{m.group(1)}")
            if tree.exists(f"{cand}/transport"):
                out.append(tree.real(cand))
    return out


def _controller_info(tree: SysTree, ctrl: str) -> dict[str, Any]:
    pci = tree.real(f"{ctrl}/device") if tree.exists(f"{ctrl}/device") else None
    transport = tree.read(f"{ctrl}/transport")
    return {
        "name": os.path.basename(ctrl),
        "model": tree.read(f"{ctrl}/model"),
        "serial": tree.read(f"{ctrl}/serial"),
        "firmware": tree.read(f"{ctrl}/firmware_rev"),
        "transport": transport,
        "address": tree.read(f"{ctrl}/address"),
        "link": link_info(tree, pci) if pci and transport == "pcie" else None,
    }


def _base_kind(tree: SysTree, d: str, name: str) -> tuple[str, dict[str, Any]]:
    """kind of a whole disk (not loop/md/dm) and its kind-specific facts."""
    real = tree.real(d)
    rel = "/" + tree.rel(real)
    rot = tree.read(f"{d}/queue/rotational")
    if re.match(r"^(zram|ram|pmem)\d+", name):
        return "ram", {}
    if re.match(r"^(nbd|rbd|drbd)\d+", name):
        return "network", {}
    if _NVME_NS.match(name) or "/nvme" in rel:
        ctrls = [_controller_info(tree, c) for c in nvme_controllers(tree, d)]
        first = ctrls[0] if ctrls else {}
        model = first.get("model") or tree.read(f"{tree.real(d + '/device')}/model")
        extra = {"nvme": {"controllers": ctrls, "link": first.get("link"), "transport": first.get("transport")},
                 "model": model, "serial": first.get("serial")}
        transport = first.get("transport")
        if transport and transport != "pcie":
            extra["network_reason"] = f"NVMe over {transport} (NVMe-oF)"
            return "network", extra
        if model and any(model.startswith(m) for m in NETWORK_NVME_MODELS):
            extra["network_reason"] = f"{model} is a network volume presented as NVMe"
            return "network", extra
        return "nvme", extra
    if "/virtio" in rel:
        return "virtio", {"serial": tree.read(f"{d}/serial")}
    if name.startswith("xvd") or "/vmbus" in rel.lower() or "/xen" in rel:
        return "virtual", {}
    if "/usb" in rel:
        return "usb", {}
    if name.startswith("mmcblk"):
        return "mmc", {}
    if re.search(r"/session\d+/", rel):  # iSCSI
        return "network", {"network_reason": "iSCSI"}
    model = tree.read(f"{d}/device/model")
    vendor = tree.read(f"{d}/device/vendor")
    extra = {"model": " ".join(x for x in (vendor, model) if x) or None}
    if rot == "1":
        return "hdd", extra
    if rot == "0":
        return "ssd", extra
    return "unknown", extra


def kname_of_majmin(tree: SysTree, majmin: str) -> str | None:
    """The kernel name (``nvme0n1p1``) of a block device number, from ``dev/block/M:m``."""
    if not re.fullmatch(r"\d+:\d+", majmin or "") or majmin.startswith("0:"):
        return None
    link = os.path.join(tree.root, "dev", "block", majmin)
    return os.path.basename(tree.real(link)) if tree.exists(link) else None


def dm_names(tree: SysTree) -> dict[str, str]:
    """device-mapper name (``vg-lv``, as under /dev/mapper) -> kernel name (``dm-0``)."""
    out = {}
    for name in tree.listdir(os.path.join(tree.root, "block")):
        if name.startswith("dm-"):
            dm = tree.read(os.path.join(tree.root, "block", name, "dm", "name"))
            if dm:
                out[dm] = name
    return out


def kname_for_mount(tree: SysTree, m: MountEntry, *, live: bool = False) -> str | None:
    """The kernel name of the block device a mount comes from: its device number, or (for btrfs and
    others with anonymous numbers) its source path, or (live only) the source's st_rdev."""
    name = kname_of_majmin(tree, m.majmin)
    if name:
        return name
    src = m.source
    if not src.startswith("/dev/"):
        return None
    base = os.path.basename(src)
    if tree.exists(os.path.join(tree.root, "class", "block", base)):
        return base
    if src.startswith("/dev/mapper/"):
        hit = dm_names(tree).get(base)
        if hit:
            return hit
    if live:
        try:
            st = os.stat(src)
        except OSError:
            return None
        return kname_of_majmin(tree, f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    return None


def block_dir(tree: SysTree, kname: str) -> str:
    return os.path.join(tree.root, "class", "block", kname)


def device_info(kname: str, sysfs_root: str = "/sys", *, tree: SysTree | None = None,
                loop_resolver: Callable[[str], dict[str, Any] | None] | None = None,
                depth: int = 0) -> dict[str, Any]:
    """What ``kname`` is, down to its disks.

    Keys: name, majmin, partition (number or None), disk (whole-disk name), kind (nvme | ssd | hdd |
    virtio | virtual | usb | mmc | network | ram | loop | md | dm | unknown), rotational, size_bytes,
    logical_block_size, model, serial, nvme {controllers, link, transport}, loop {backing_file,
    backing}, md {level}, dm {name, uuid, subtype}, members [device_info], effective_kind, speed_class
    (fast | medium | slow | unknown | ram), disks [leaf whole-disk names], stack ["nvme0n1p1", ...],
    error. ``loop_resolver(backing_file)`` describes the device under a loop's backing file.
    """
    tree = tree or SysTree(sysfs_root)
    d = block_dir(tree, kname)
    if not tree.exists(d):
        return {"name": kname, "kind": "unknown", "effective_kind": "unknown", "speed_class": "unknown",
                "disks": [], "stack": [kname], "members": [], "error": f"no sysfs entry for {kname}"}
    part = _int(tree.read(f"{d}/partition"))
    whole = os.path.dirname(tree.real(d)) if part is not None else tree.real(d)
    disk = os.path.basename(whole)
    info: dict[str, Any] = {
        "name": kname, "majmin": tree.read(f"{d}/dev"), "partition": part, "disk": disk,
        "size_bytes": (_int(tree.read(f"{d}/size")) or 0) * SECTOR,
        "rotational": {"0": False, "1": True}.get(tree.read(f"{whole}/queue/rotational") or ""),
        "logical_block_size": _int(tree.read(f"{whole}/queue/logical_block_size")),
        "model": None, "serial": None, "members": [], "error": None,
    }
    members: list[dict[str, Any]] = []
    if tree.isdir(f"{whole}/loop") or disk.startswith("loop"):
        backing = tree.read(f"{whole}/loop/backing_file")
        info["kind"] = "loop"
        info["loop"] = {"backing_file": backing,
                        "backing": loop_resolver(backing) if loop_resolver and backing and depth < MAX_DEPTH
                        else None}
        if info["loop"]["backing"]:
            members = [info["loop"]["backing"]]
    elif tree.isdir(f"{whole}/md") or re.match(r"^md\d+", disk):
        info["kind"] = "md"
        info["md"] = {"level": tree.read(f"{whole}/md/level")}
    elif tree.isdir(f"{whole}/dm"):
        uuid = tree.read(f"{whole}/dm/uuid") or ""
        sub = ("lvm" if uuid.startswith("LVM-") else "crypt" if uuid.startswith("CRYPT-")
               else "multipath" if uuid.startswith("mpath-") else "dm")
        info["kind"] = "dm"
        info["dm"] = {"name": tree.read(f"{whole}/dm/name"), "uuid": uuid or None, "subtype": sub}
    else:
        kind, extra = _base_kind(tree, whole, disk)
        info["kind"] = kind
        info.update(extra)
    if info["kind"] in ("md", "dm") and depth < MAX_DEPTH:
        for slave in tree.listdir(f"{whole}/slaves"):
            members.append(device_info(slave, tree=tree, loop_resolver=loop_resolver, depth=depth + 1))
    info["members"] = members
    _summarize(info)
    return info


def _summarize(info: dict[str, Any]) -> None:
    """Fill effective_kind, speed_class, disks and stack from the kind and the members."""
    members, name, disk = info["members"], info["name"], info["disk"]
    own = [name] + ([disk] if disk != name else [])
    if info["kind"] in ("loop", "md", "dm"):
        if members:
            kinds = {m["effective_kind"] for m in members}
            info["effective_kind"] = kinds.pop() if len(kinds) == 1 else "mixed"
            info["speed_class"] = min((m["speed_class"] for m in members), key=lambda c: _CLASS_RANK[c])
            info["disks"] = [x for m in members for x in m["disks"]]
            info["stack"] = own + [x for m in members for x in m["stack"]]
        else:
            info["effective_kind"], info["speed_class"] = "unknown", "unknown"
            info["disks"], info["stack"] = [], own
    else:
        info["effective_kind"] = info["kind"]
        info["speed_class"] = SPEED_CLASS.get(info["kind"], "unknown")
        info["disks"] = [disk]
        info["stack"] = own


def leaves(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole-disk infos at the bottom of a device stack."""
    if info.get("members"):
        return [x for m in info["members"] for x in leaves(m)]
    return [info] if info.get("kind") not in ("loop", "md", "dm") else []


def describe_device(info: dict[str, Any] | None) -> str:
    """One line: ``nvme0n1p1 on nvme0n1: NVMe, Samsung SSD 990 PRO, PCIe Gen4 x4 (7.88 GB/s)``."""
    if not info:
        return "unknown device"
    kind = info.get("kind")
    labels = {"nvme": "NVMe", "ssd": "SATA/SAS SSD", "hdd": "rotational disk", "virtio": "virtio disk",
              "virtual": "virtual disk", "usb": "USB disk", "mmc": "SD/eMMC", "network": "network block device",
              "ram": "RAM disk", "loop": "loop device", "md": "md RAID", "dm": "device-mapper", "unknown": "unknown"}
    head = info["name"] + (f" on {info['disk']}" if info.get("disk") and info["disk"] != info["name"] else "")
    bits = [labels.get(kind, kind or "?")]
    if kind == "loop":
        bits.append(f"backing file {(info.get('loop') or {}).get('backing_file')}")
    if kind == "md":
        bits.append((info.get("md") or {}).get("level") or "?")
    if kind == "dm":
        dm = info.get("dm") or {}
        bits.append(f"{dm.get('subtype')} {dm.get('name')}")
    if info.get("model"):
        bits.append(str(info["model"]))
    if kind == "nvme":
        bits.append(link_label((info.get("nvme") or {}).get("link")))
    if info.get("network_reason"):
        bits.append(info["network_reason"])
    text = f"{head}: " + ", ".join(b for b in bits if b)
    if info.get("members"):
        text += " -> " + "; ".join(describe_device(m) for m in info["members"])
    return text


# -- filesystem identity ---------------------------------------------------------------------------------

def by_uuid(dev_root: str = "/dev") -> dict[str, str]:
    """kernel name -> filesystem UUID, from the ``disk/by-uuid`` symlinks udev maintains."""
    folder = os.path.join(dev_root, "disk", "by-uuid")
    out: dict[str, str] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for uuid in names:
        try:
            target = os.readlink(os.path.join(folder, uuid))
        except OSError:
            continue
        out[os.path.basename(target)] = uuid.replace("\\x2d", "-")
    return out


def parse_export(text: str) -> dict[str, str]:
    """``KEY=value`` lines (``blkid -o export``, udev ``E:`` records) -> dict."""
    out = {}
    for line in text.splitlines():
        line = line[2:] if line.startswith("E:") else line
        key, sep, value = line.partition("=")
        if sep and key and key.replace("_", "").isalnum():
            out[key] = value
    return out


def udev_props(majmin: str | None, udev_root: str = "/run/udev") -> dict[str, str]:
    """udev's database record of a block device (``ID_FS_TYPE``, ``ID_FS_UUID``, ``ID_PART_TABLE_TYPE``)."""
    if not majmin:
        return {}
    try:
        with open(os.path.join(udev_root, "data", f"b{majmin}"), encoding="utf-8", errors="replace") as fh:
            return {k: v for k, v in parse_export(fh.read()).items() if k.startswith("ID_")}
    except OSError:
        return {}


def blkid_export(devpath: str, *, probe: bool | None = None, timeout: float = 10.0
                 ) -> tuple[dict[str, str] | None, Evidence]:
    """``blkid [-p] -o export -- DEV``: TYPE, UUID, PTTYPE ... ``probe`` (default: when root) reads the
    device itself instead of blkid's cache. Returns {} when a probing root blkid found no signature at
    all (exit 2), None when the answer is unknown (blkid missing, failed, or unprivileged and silent)."""
    if probe is None:
        probe = os.geteuid() == 0
    argv = ["blkid"] + (["-p"] if probe else []) + ["-o", "export", "--", devpath]
    ev = runner.run(argv, timeout=timeout, label=f"blkid {devpath}")
    if ev.exit_code == 0:
        return parse_export(ev.stdout), ev
    if ev.exit_code == 2 and probe and os.geteuid() == 0 and not ev.stderr.strip() and _readable(devpath):
        return {}, ev
    return None, ev


def _readable(devpath: str) -> bool:
    """Whether the device can really be opened (blkid -p says "nothing found" when it cannot)."""
    try:
        os.close(os.open(devpath, os.O_RDONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


def fs_identity(kname: str, majmin: str | None, *, dev_root: str = "/dev", udev_root: str = "/run/udev",
                use_blkid: bool = False, uuid_map: dict[str, str] | None = None
                ) -> tuple[dict[str, Any], list[Evidence]]:
    """Filesystem type and UUID of a device, from ``dev_root``/disk/by-uuid, udev's database and (when
    asked, on the live machine) blkid, with whether the sources agree; blkid wins when they differ.
    Keys: uuid, type, pttype, usage, sources {by-uuid, udev, blkid: what each said}, known (a source
    that reads signatures answered), agree."""
    evidence: list[Evidence] = []
    links = uuid_map if uuid_map is not None else by_uuid(dev_root)
    udev = udev_props(majmin, udev_root)
    sources: dict[str, dict[str, str | None]] = {}
    if kname in links:
        sources["by-uuid"] = {"uuid": links[kname]}
    if udev:
        sources["udev"] = {"uuid": udev.get("ID_FS_UUID"), "type": udev.get("ID_FS_TYPE"),
                           "pttype": udev.get("ID_PART_TABLE_TYPE"), "usage": udev.get("ID_FS_USAGE")}
    if use_blkid:
        props, ev = blkid_export(os.path.join("/dev", kname))  # blkid reads the live device node
        evidence.append(ev)
        if props is not None:
            sources["blkid"] = {"uuid": props.get("UUID"), "type": props.get("TYPE"),
                                "pttype": props.get("PTTYPE"), "usage": props.get("USAGE")}
    uuids = {s["uuid"] for s in sources.values() if s.get("uuid")}

    def first(key: str) -> str | None:
        for name in ("blkid", "udev", "by-uuid"):
            v = (sources.get(name) or {}).get(key)
            if v:
                return v
        return None

    return {"uuid": first("uuid"), "type": first("type"), "pttype": first("pttype"), "usage": first("usage"),
            "sources": sources, "known": "udev" in sources or "blkid" in sources,
            "agree": len(uuids) <= 1}, evidence


# -- NVMe inventory ------------------------------------------------------------------------------------

#: Signatures of a device that belongs to something bigger (never format or mount it directly).
MEMBER_TYPES = frozenset({"LVM2_member", "linux_raid_member", "zfs_member", "crypto_LUKS", "bcache", "ceph",
                          "swap", "isw_raid_member", "ddf_raid_member"})


def parse_swaps(text: str) -> list[str]:
    """The swap areas named in ``/proc/swaps`` (device or file paths)."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if parts:
            out.append(parts[0].replace("\\040", " "))
    return out


def _holders(tree: SysTree, kname: str, depth: int = 0) -> list[str]:
    """Every device stacked on ``kname`` (dm, md, ...), transitively."""
    if depth > MAX_DEPTH:
        return []
    out = []
    for h in tree.listdir(f"{block_dir(tree, kname)}/holders"):
        out.append(h)
        out.extend(_holders(tree, h, depth + 1))
    return out


def partitions(tree: SysTree, disk: str) -> list[str]:
    d = tree.real(block_dir(tree, disk))
    return [n for n in tree.listdir(d) if n.startswith(disk) and tree.exists(f"{d}/{n}/partition")]


def used_knames(tree: SysTree, mounts: Iterable[MountEntry], swaps: Iterable[str], *, live: bool = False
                ) -> dict[str, str]:
    """kernel name -> how it is used (``mounted at /x`` or ``swap``) for every mounted or swap device."""
    used: dict[str, str] = {}
    for m in mounts:
        k = kname_for_mount(tree, m, live=live)
        if k and k not in used:
            used[k] = f"mounted at {m.point}"
    names = dm_names(tree)
    for s in swaps:
        if not s.startswith("/dev/"):
            continue
        base = os.path.basename(s)
        k = names.get(base, base) if s.startswith("/dev/mapper/") else base
        used.setdefault(k, "swap")
    return used


def nvme_inventory(sysfs_root: str = "/sys", *, mounts: Iterable[MountEntry] = (), swaps: Iterable[str] = (),
                   dev_root: str = "/dev", udev_root: str = "/run/udev", use_blkid: bool = False,
                   live: bool = False, tree: SysTree | None = None) -> tuple[list[dict[str, Any]], list[Evidence]]:
    """Every NVMe namespace: info, partitions, what uses it, its filesystem signatures, and ``state``:

    - ``in-use``: it, a partition, or a device stacked on them is mounted or swap;
    - ``member``: held by a dm/md device or carrying an LVM/RAID/ZFS signature, but not mounted;
    - ``has-filesystem``: unmounted with a filesystem on it or on a partition (mount it: data may be there);
    - ``blank``: no partitions, no holders, no signature: it can be formatted (destroys nothing known);
    - ``unknown``: unmounted, but its signatures could not be read (run as root).
    ``unmounted`` is True for every state but ``in-use``.
    """
    tree = tree or SysTree(sysfs_root)
    mounts = list(mounts)
    used = used_knames(tree, mounts, swaps, live=live)
    uuid_map = by_uuid(dev_root)
    evidence: list[Evidence] = []
    drives = []
    for name in tree.listdir(os.path.join(tree.root, "block")):
        if not _NVME_NS.match(name) or _NVME_PATH.match(name):
            continue
        info = device_info(name, tree=tree)
        parts = partitions(tree, name)
        holders = {n: _holders(tree, n) for n in [name] + parts}
        uses = []
        for n in [name] + parts:
            for k in [n] + holders[n]:
                if k in used:
                    uses.append({"device": k, "via": n, "use": used[k]})
        idents = {}
        for n in [name] + parts:
            ident, evs = fs_identity(n, tree.read(f"{block_dir(tree, n)}/dev"), dev_root=dev_root,
                                     udev_root=udev_root, use_blkid=use_blkid, uuid_map=uuid_map)
            idents[n] = ident
            evidence.extend(evs)
        types = {n: i.get("type") for n, i in idents.items() if i.get("type")}
        members = {n: t for n, t in types.items() if t in MEMBER_TYPES}
        if uses:
            state = "in-use"
            reason = "; ".join(f"{u['device']} {u['use']}" for u in uses)
        elif any(holders.values()) or members:
            state = "member"
            held = sorted({h for hs in holders.values() for h in hs})
            reason = ", ".join(([f"held by {', '.join(held)}"] if held else [])
                               + [f"{n} is a {t}" for n, t in members.items()])
            reason += " (not mounted)"
        elif types:
            state = "has-filesystem"
            reason = ", ".join(f"{n}: {t}" for n, t in types.items()) + ", not mounted"
        elif all(i["known"] for i in idents.values()):
            pt = idents[name].get("pttype")
            state = "blank" if not parts and not pt else "unknown"
            reason = ("no partition table, no filesystem, nothing stacked on it" if state == "blank"
                      else f"{pt or 'partition'} table with partitions but no recognised filesystem")
        else:
            state = "unknown"
            reason = "its signatures could not be read (no udev record; run as root so blkid can probe it)"
        drives.append({
            "name": name, "path": os.path.join(dev_root, name), "size_bytes": info.get("size_bytes"),
            "model": info.get("model"), "serial": info.get("serial"), "kind": info.get("kind"),
            "link": (info.get("nvme") or {}).get("link"), "partitions": parts,
            "holders": sorted({h for hs in holders.values() for h in hs}), "uses": uses,
            "filesystems": {n: {"type": i.get("type"), "uuid": i.get("uuid"), "pttype": i.get("pttype")}
                            for n, i in idents.items() if i.get("sources")},
            "state": state, "reason": reason, "unmounted": state != "in-use",
        })
    return drives, evidence
