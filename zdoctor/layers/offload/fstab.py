"""fstab lines by UUID, the commands that put offload on a drive, and a careful fstab apply.

A wrong fstab line can stop a node from booting and device names (``/dev/nvme0n1p1``) can change
between boots, so lines name the filesystem by ``UUID=`` and carry ``nofail`` with a short
``x-systemd.device-timeout``. Applying one backs the file up, validates the new text with
``findmnt --verify`` before it replaces the file, mounts, and restores the backup on any failure.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import shlex
import shutil
import stat
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.model import Evidence, Remedy
from zdoctor.edit.atomic import CheckedReplace, replace_checked
from zdoctor.edit.filefix import owner_only
from zdoctor.proc import runner
from zdoctor.proc.userfile import open_regular, read_system_table
from zdoctor.readers.mounts import MountEntry, unescape

FSTAB = "/etc/fstab"
DEFAULT_OPTIONS = "defaults,noatime,nofail,x-systemd.device-timeout=10s"
_UUID = re.compile(r"^[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*$")
_LABEL = "zd-offload"
MKFS = {"ext4": "mkfs.ext4 -q -U {uuid} -L {label} -- {dev}", "xfs": "mkfs.xfs -q -m uuid={uuid} -L {label} -- {dev}"}


class FstabError(ValueError):
    """A line that must not be written (a device name instead of a UUID, a relative mount point ...)."""


def escape(text: str) -> str:
    """An fstab field: backslash, space, tab and newline as octal escapes (``\\134``, ``\\040`` ...)."""
    return (text.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012"))


@dataclass
class FstabEntry:
    line_no: int
    spec: str
    file: str
    vfstype: str
    mntops: str
    freq: str
    passno: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_fstab(text: str) -> list[FstabEntry]:
    """The active entries (comments and blank lines skipped), fields unescaped, with line numbers."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        f = s.split()
        if len(f) < 2:
            continue
        f += ["auto", "defaults", "0", "0"][len(f) - 2:] if len(f) < 6 else []
        out.append(FstabEntry(n, unescape(f[0]), unescape(f[1]), unescape(f[2]), unescape(f[3]), f[4], f[5]))
    return out


def read_fstab(path: str = FSTAB) -> list[FstabEntry]:
    text = read_system_table(path)
    return [] if text is None else parse_fstab(text)


def passno_for(fstype: str) -> int:
    """fsck order: 2 for ext2/3/4 (checked after root); 0 for xfs and btrfs, whose fsck does nothing at
    boot, and for everything else."""
    return 2 if fstype in ("ext2", "ext3", "ext4") else 0


def fstab_line(uuid: str, mountpoint: str, fstype: str, options: str = DEFAULT_OPTIONS) -> str:
    """``UUID=<uuid> <mountpoint> <fstype> <options> 0 <passno>`` with the fields escaped. Refuses
    anything but a UUID as the source."""
    if not _UUID.match(uuid or ""):
        raise FstabError(f"not a filesystem UUID: {uuid!r} (fstab lines name filesystems by UUID, never by "
                         "device name)")
    if not mountpoint.startswith("/") or "\0" in mountpoint:
        raise FstabError(f"mount point must be an absolute path: {mountpoint!r}")
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", fstype or ""):
        raise FstabError(f"not a filesystem type: {fstype!r}")
    if not options or any(c.isspace() for c in options):
        raise FstabError(f"bad mount options: {options!r}")
    mp = os.path.normpath(mountpoint)
    return f"UUID={uuid} {escape(mp)} {fstype} {options} 0 {passno_for(fstype)}"


def covering_entries(entries: list[FstabEntry], path: str) -> list[FstabEntry]:
    """fstab entries whose mount point is ``path`` or one of its parents, deepest first."""
    p = os.path.abspath(path)
    hits = [e for e in entries if e.file.startswith("/") and
            (p == e.file.rstrip("/") or p.startswith(e.file.rstrip("/") + "/") or e.file == "/")]
    return sorted(hits, key=lambda e: len(e.file), reverse=True)


def unmounted_entries(entries: list[FstabEntry], path: str, mounts: list[MountEntry]) -> list[FstabEntry]:
    """Entries meant to hold ``path`` whose mount point has nothing mounted on it: DeepSpeed would
    write into the empty directory underneath, on whatever disk holds it."""
    points = {m.point.rstrip("/") or "/" for m in mounts}
    skip = {"swap", "none"}
    return [e for e in covering_entries(entries, path)
            if e.vfstype not in skip and "noauto" not in e.mntops.split(",")
            and (e.file.rstrip("/") or "/") not in points]


# -- remedies -----------------------------------------------------------------------------------------

def q(text: str) -> str:
    return shlex.quote(text)


def new_uuid() -> str:
    return str(uuidlib.uuid4())


def mkfs_remedy(device: str, fstype: str = "ext4", uuid: str | None = None, label: str = _LABEL) -> Remedy:
    """Format a blank device (destructive; its own step, asked for separately)."""
    uuid = uuid or new_uuid()
    if fstype not in MKFS:
        raise FstabError(f"no mkfs recipe for {fstype!r} (use ext4 or xfs)")
    guard = f'test -z "$(wipefs --no-act --noheadings -- {q(device)})"'
    cmd = MKFS[fstype].format(uuid=q(uuid), label=q(label), dev=q(device))
    return Remedy(
        title=f"Format {device} as {fstype} (DESTROYS everything on it)",
        commands=[f"{guard} && {cmd}"],
        verified=False, requires_root=True, undo=[],
        explanation=(f"DESTRUCTIVE: writes a new {fstype} filesystem over the whole of {device}; whatever it held "
                     "is gone and this cannot be undone. zdoctor found no partition table, filesystem, RAID, LVM "
                     "or other signature on it; the command re-checks that with wipefs right before formatting "
                     f"and does nothing if any signature appeared. The filesystem gets UUID {uuid}, which the "
                     "fstab line of the next step names. Run it only if you are sure the drive is meant for this."))


def _holds(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file, not a link, whose bytes are ``data``."""
    try:
        with open_regular(path, nofollow=True) as fh:
            return fh.read(len(data) + 1) == data
    except OSError:
        return False


def fstab_remedy(uuid: str, mountpoint: str, fstype: str, *, fstab_path: str = FSTAB,
                 stamp: str | None = None, options: str = DEFAULT_OPTIONS, mount_now: bool = True) -> Remedy:
    """Add the UUID line the careful way: build the new file beside the old one, ``findmnt --verify`` it,
    back the old one up, move the new one into place, and (``mount_now``) mount it.

    The backup name is fixed here, from the filesystem's UUID: the commands, the undo and the guide's
    apply (which runs :func:`apply_fstab_line` as root, see ``action``) all name the same file, however
    often the finding is evaluated.
    """
    line = fstab_line(uuid, mountpoint, fstype, options)
    # Named after the filesystem, not the clock: the same finding evaluated again (a resumed session, an
    # export) names the same backup, so the recorded undo always points at the file the apply wrote.
    stamp = stamp or f"zdoctor-{uuid.split('-')[0].lower()}"
    backup = f"{fstab_path}.bak.{stamp}"
    staged = f"{fstab_path}.zdoctor-new.{stamp}"
    mp = os.path.normpath(mountpoint)
    reload = "if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi"
    mount = [f"mount -- {q(mp)}"] if fstab_path == FSTAB else [f"mount --fstab {q(fstab_path)} -- {q(mp)}"]
    # The staged file and the backup are written in the fstab's folder: only as its owner (root for /etc).
    commands = [owner_only(os.path.dirname(os.path.abspath(fstab_path)))] + (
        [f"mkdir -p -- {q(mp)}"] if mount_now else []) + [
        f"cp -p -- {q(fstab_path)} {q(staged)}",
        f"printf '%s\\n' {q(line)} | tee -a -- {q(staged)} >/dev/null",
        f"findmnt --verify --tab-file {q(staged)}",
        f"cp -p -- {q(fstab_path)} {q(backup)}",
        f"mv -f -- {q(staged)} {q(fstab_path)}",
        reload,
    ] + (mount if mount_now else [])
    undo = ([f"umount -- {q(mp)}"] if mount_now else []) + [f"cp -p -- {q(backup)} {q(fstab_path)}", reload]
    return Remedy(
        title=f"Mount UUID={uuid} at {mp} at every boot",
        commands=commands, verified=False, requires_root=True, undo=undo,
        action={"kind": "fstab-add", "fstab": fstab_path, "line": line, "backup": backup,
                "mountpoint": mp, "mount": mount_now},
        explanation=(f"Adds `{line}` to {fstab_path}. The new file is built beside the old one ({staged}) and "
                     "checked with findmnt --verify before anything changes; only then is the old file backed up "
                     f"to {backup} and the new one moved into place in one rename, so the file is always either "
                     "the old one or the new one, never half-written. The filesystem is named by UUID "
                     "because /dev/nvme* names follow probe order and can change between boots. `nofail` and "
                     "`x-systemd.device-timeout=10s` let the node boot (without the mount) if the drive dies or "
                     "is removed, instead of dropping to an emergency shell. `noatime` saves a metadata write per "
                     "read. If findmnt --verify reports an error, stop: nothing was changed (remove the staged "
                     "file). Applied from the guide, a failed mount puts the old file back."))


def offload_dir_remedy(directory: str, user: str, group: str, *, shared: bool = False,
                       rule: str | None = None) -> Remedy:
    """Create the offload directory for the training user (0750; 1777 only when several users share it).

    ``rule`` says what chose ``user`` (``--user``, the owner of the ``--python`` environment, SUDO_USER,
    the user zdoctor runs as); it is part of the explanation. For root there is no ``chown`` line: the
    directory is root's as created, and the text says so instead of speaking of a training user.
    """
    mode = "1777" if shared else "0750"
    d = os.path.normpath(directory)
    cmds = [f"mkdir -p -- {q(d)}"]
    is_root = user in ("root", "0")
    if not shared and not is_root:
        cmds.append(f"chown -- {q(f'{user}:{group}')} {q(d)}")
    cmds.append(f"chmod {mode} -- {q(d)}")
    chosen = f" The training user is {user}, chosen by: {rule}." if rule else ""
    if shared:
        why = ("mode 1777 (sticky, like /tmp): every user may create files and only a file's owner may remove it")
    elif is_root:
        why = ("owned by root with mode 0750: only root can write there, so this fits a training that runs as "
               "root; if it runs as another user, name that user with --user and zdoctor gives it the directory")
    else:
        why = (f"owned by {user}:{group} with mode 0750: the training user writes, its group reads, nobody else "
               "can read or tamper with the swapped optimizer state")
    owner = "root" if is_root and not shared else user
    return Remedy(title=f"Create the offload directory {d}" + ("" if shared else f" for {owner}"), commands=cmds,
                  verified=False, requires_root=True, undo=[f"rmdir -- {q(d)}"],
                  explanation=f"DeepSpeed writes its swap files under nvme_path; the directory is {why}.{chosen} "
                              "Never use 777: anyone on the node could replace the swap files.")


def mount_remedy(mountpoint: str) -> Remedy:
    """Mount an fstab entry that is not mounted."""
    return Remedy(title=f"Mount {mountpoint} as fstab describes", commands=[f"mount -- {q(mountpoint)}"],
                  verified=False, requires_root=True, undo=[f"umount -- {q(mountpoint)}"],
                  explanation="fstab names a filesystem for this mount point but nothing is mounted there, so "
                              "files written under it land on the disk holding the parent directory.")


# -- apply ----------------------------------------------------------------------------------------------

_COUNT = re.compile(r"(\d+)\s+(parse errors?|errors?|warnings?)")


def parse_verify(stdout: str, stderr: str = "") -> dict[str, Any]:
    """``findmnt --verify`` output -> {targets: {target: {errors, warnings}}, parse_errors, errors,
    warnings, success, summary}."""
    targets: dict[str, dict[str, list[str]]] = {}
    cur: str | None = None
    for line in stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            cur = line
            targets.setdefault(cur, {"errors": [], "warnings": []})
            continue
        s = line.strip()
        if cur is not None and s.startswith("[E]"):
            targets[cur]["errors"].append(s[3:].strip())
        elif cur is not None and s.startswith("[W]"):
            targets[cur]["warnings"].append(s[3:].strip())
    counts = {"parse_errors": 0, "errors": 0, "warnings": 0}
    summary = ""
    for line in (stderr + "\n" + stdout).splitlines():
        if "Success, no errors" in line or _COUNT.search(line) and ("error" in line and "warning" in line):
            summary = line.strip()
            for n, what in _COUNT.findall(line):
                key = "parse_errors" if what.startswith("parse") else "errors" if what.startswith("error") \
                    else "warnings"
                counts[key] = int(n)
    return {"targets": targets, **counts, "success": summary.startswith("Success"), "summary": summary}


def verify(tab_file: str, findmnt: str = "findmnt", timeout: float = 30.0) -> tuple[dict[str, Any], Evidence]:
    """Run ``findmnt --verify --tab-file FILE``; ``available`` is False when findmnt is missing."""
    ev = runner.run([findmnt, "--verify", "--tab-file", tab_file], timeout=timeout,
                    label=f"findmnt --verify --tab-file {tab_file}")
    res = parse_verify(ev.stdout, ev.stderr)
    res["available"] = not (ev.error or "").endswith("executable not found")
    res["exit_code"], res["error"] = ev.exit_code, ev.error
    return res, ev


@dataclass
class ApplyRecord:
    """What an fstab apply did, for the session log."""

    fstab: str
    line: str
    ok: bool = False
    backup: str | None = None
    diff: str = ""
    validation: dict[str, Any] | None = None
    created_mountpoint: bool = False
    mount: dict[str, Any] | None = None
    rolled_back: bool = False
    restored_identical: bool | None = None
    error: str | None = None
    steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_link(fstab_path: str) -> tuple[str, str | None]:
    """The file to edit for ``fstab_path`` and a note: a symbolic link is followed only when the link's
    folder, the target and every folder above the target belong to root and only root may write them
    (a link someone else controls is refused with :class:`FstabError`)."""
    if not os.path.islink(fstab_path):
        return fstab_path, None
    real = os.path.realpath(fstab_path)
    checked = [os.path.dirname(os.path.abspath(fstab_path)), real]
    d = os.path.dirname(real)
    while True:
        checked.append(d)
        if d == os.path.dirname(d):
            break
        d = os.path.dirname(d)
    for path in checked:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise FstabError(f"{fstab_path} is a symbolic link to {real}: cannot check {path} "
                             f"({exc.strerror or exc}); nothing changed") from None
        if st.st_uid != 0 or st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
                                                          and path != os.path.dirname(real)):
            raise FstabError(f"{fstab_path} is a symbolic link to {real}, and {path} is not root's alone "
                             "(owner or write permission): refusing to edit it; nothing changed")
    return real, f"{fstab_path} is a symbolic link to {real} (root's alone): editing {real}"


def apply_fstab_line(fstab_path: str, line: str, *, mount: Sequence[str] | Callable[[], Evidence],
                     findmnt: str = "findmnt", stamp: str | None = None, make_mountpoint: bool = True,
                     timeout: float = 60.0, backup: str | None = None,
                     on_step: Callable[[str], None] | None = None) -> ApplyRecord:
    """Add ``line`` to the fstab at ``fstab_path`` the careful way, and mount it.

    1. refuse when findmnt is missing, the line is malformed, or the file already has an entry for
       the same mount point or source; 2. write the new text to a temp file beside it; 3. ``findmnt
    --verify`` it: any error on the new target, or more errors than the original had, refuses (nothing
    changed); 4. back the file up (``backup``, the name the remedy's undo gives, else
    ``<fstab>.bak.<stamp>``; mode kept; written atomically); 5. replace the file atomically (one rename:
    a kill at any point leaves the old file or the new one, never a partial one); 6. run ``mount``
    (argv, or a callable returning Evidence); 7. on any failure after the replace (including
    KeyboardInterrupt) restore the original bytes from the backup. ``on_step`` sees each step as it is
    done. Returns the record of every step; never raises for a failure on the way (KeyboardInterrupt is
    re-raised after rollback).
    """
    rec = ApplyRecord(fstab=fstab_path, line=line)

    def step(text: str) -> None:
        rec.steps.append(text)
        if on_step is not None:
            on_step(text)

    new_entries = parse_fstab(line)
    if len(new_entries) != 1 or "\n" in line.strip():
        rec.error = f"not one fstab line: {line!r}"
        return rec
    new = new_entries[0]
    if shutil.which(findmnt) is None and not os.access(findmnt, os.X_OK):
        rec.error = (f"{findmnt} (util-linux) not found: refusing to change {fstab_path} without validating it "
                     "first; install util-linux (it provides findmnt)")
        return rec
    try:
        fstab_path, note = resolve_link(fstab_path)
    except FstabError as exc:
        rec.error = str(exc)
        return rec
    if note:
        if backup is not None:  # the backup goes beside the file that is edited
            backup = os.path.join(os.path.dirname(fstab_path), os.path.basename(backup))
            note += f" (backup: {backup})"
        step(note)
    try:
        with open(fstab_path, "rb") as fh:
            original = fh.read()
    except OSError as exc:
        rec.error = f"{fstab_path}: cannot read ({exc.strerror or exc})"
        return rec
    old_text = original.decode("utf-8", "surrogateescape")
    for e in parse_fstab(old_text):
        if e.file.rstrip("/") == new.file.rstrip("/") or e.spec == new.spec:
            rec.error = (f"{fstab_path}:{e.line_no}: already has an entry for "
                         f"{'mount point ' + e.file if e.file.rstrip('/') == new.file.rstrip('/') else e.spec}; "
                         "refusing to add a second one")
            return rec
    # An existing backup name counts only as a regular file (never a link) holding these very bytes; anything
    # else there is left alone and the backup goes under the next free name.
    kept = backup is not None and _holds(backup, original)
    new_text = old_text + ("" if not old_text or old_text.endswith("\n") else "\n") + line.strip() + "\n"
    rec.diff = "".join(difflib.unified_diff(old_text.splitlines(True), new_text.splitlines(True),
                                            fromfile=fstab_path, tofile=f"{fstab_path} (new)"))
    if make_mountpoint and not os.path.isdir(new.file):
        try:
            os.makedirs(new.file)
            rec.created_mountpoint = True
            step(f"created mount point {new.file}")
        except OSError as exc:
            rec.error = f"{new.file}: cannot create the mount point ({exc.strerror or exc})"
            return rec
    rep: CheckedReplace | None = None
    replaced = False
    new_bytes = new_text.encode("utf-8", "surrogateescape")
    try:
        rep = CheckedReplace.stage(fstab_path, new_bytes, expect=original, what="fstab")
        step(f"wrote the new text to {rep.staged_path}")
        before, _ = verify(fstab_path, findmnt, timeout)
        after, ev = verify(rep.staged_path, findmnt, timeout)
        mine = next((t for name, t in after["targets"].items() if name.rstrip("/") == new.file.rstrip("/")), None)
        rec.validation = {"argv": ev.argv, "exit_code": ev.exit_code, "stdout": ev.stdout, "stderr": ev.stderr,
                          "summary": after["summary"], "errors": after["errors"], "warnings": after["warnings"],
                          "parse_errors": after["parse_errors"], "new_target": mine,
                          "errors_before": before["errors"], "parse_errors_before": before["parse_errors"]}
        problem = None
        if not after["available"]:
            problem = f"{findmnt} could not run: {ev.error}"
        elif ev.error:
            problem = f"findmnt --verify did not finish: {ev.error}"
        elif mine and mine["errors"]:
            problem = f"findmnt --verify rejects the new line: {'; '.join(mine['errors'])}"
        elif after["parse_errors"] > before["parse_errors"] or after["errors"] > before["errors"]:
            problem = f"findmnt --verify finds new problems: {after['summary']}"
        if problem:
            rec.error = problem
            step("validation failed; the fstab was not changed")
            return rec
        step(f"validated: {after['summary']}")
        wanted = backup or f"{fstab_path}.bak.{stamp or time.strftime('%Y%m%dT%H%M%S')}"
        # the core re-reads the file right before the rename: an edit made meanwhile is refused, not lost
        rec.backup = wanted if kept else rep.back_up(wanted)
        step(f"backed up {fstab_path} to {rec.backup}" + (" (already there)" if kept else ""))
        rep.commit(None)
        replaced = True
        step(f"replaced {fstab_path}")
        mev = mount() if callable(mount) else runner.run(list(mount), timeout=timeout, label="mount")
        rec.mount = mev.to_dict()
        if mev.exit_code != 0 or mev.error:
            raise RuntimeError(f"mount failed: {mev.error or (mev.stderr.strip() or f'exit {mev.exit_code}')}")
        step("mounted")
        rec.ok = True
        return rec
    except BaseException as exc:
        if rec.error is None:
            rec.error = str(exc) if isinstance(exc, (RuntimeError, InputError)) else f"{type(exc).__name__}: {exc}"
        if replaced:
            _rollback(rec, fstab_path, original, new_bytes)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return rec
    finally:
        if rep is not None:
            rep.close()
        if not rec.ok and rec.created_mountpoint:
            with contextlib.suppress(OSError):
                os.rmdir(new.file)
                rec.steps.append(f"removed the mount point {new.file} it had created")


def _rollback(rec: ApplyRecord, fstab_path: str, original: bytes, new: bytes) -> None:
    """Copy the backup back over the file (atomically) and check the bytes are the original ones."""
    data = original
    if rec.backup:
        try:
            with open(rec.backup, "rb") as fh:
                data = fh.read()
        except OSError:
            data = original
    try:
        replace_checked(fstab_path, data, expect=new, backup=None, what="fstab")
        with open(fstab_path, "rb") as fh:
            rec.restored_identical = fh.read() == original
        rec.rolled_back = True
        rec.steps.append(f"rolled back {fstab_path} from {rec.backup}")
    except (OSError, InputError) as exc:
        rec.restored_identical = False
        rec.steps.append(f"ROLLBACK FAILED ({getattr(exc, 'strerror', None) or exc}): restore by hand with "
                         f"cp -p -- {q(rec.backup or '')} {q(fstab_path)}")
