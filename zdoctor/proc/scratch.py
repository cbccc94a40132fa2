"""zdoctor's own temporary files live in one folder per run and place: ``zdoctor-run-NS-PID-START-xxxx``
under the temporary directory, or a fallback place a probe writes in (:data:`FALLBACK_PLACES`), named for
the run's process (its pid namespace, its pid and its start time, in clock ticks since boot, from
``/proc/PID/stat``). The run removes them when it ends; a run that was killed (SIGKILL) leaves them, and
the next run in the same pid namespace removes them (:func:`sweep_stale`, in every place): only real
directories of this user whose process is gone (a container sharing the temporary directory sees other
pids, and leaves their folders alone). The compile test's sources, the compiler's own temporary files (its
TMPDIR points there), the lock trials' copies, the libaio link test, a file edit's new text and the
/dev/shm write test are made in them."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator

from zdoctor.proc.leftovers import named_entries

PREFIX = "zdoctor-run-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-(\d+)-[A-Za-z0-9_]+$")
#: The places besides the temporary directory where a probe makes its folder: the compile test's fallbacks
#: when the temporary directory is full, and the /dev/shm write test.
FALLBACK_PLACES = ("/var/tmp", "/dev/shm")
#: The folder's mode: other accounts may pass through it (a lock trial runs as the op cache's owner in a
#: folder given to it), never list it or write in it.
MODE = 0o711

_lock = threading.Lock()
#: This run's folders, by the temporary directory each is in (one, unless that directory was changed).
_folders: dict[str, str] = {}
_owner = 0


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of ``/proc/PID/stat``), None when there is no such
    process or it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def pid_namespace() -> str | None:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``), None where it cannot be read."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def run_folder(root: str | None = None) -> str:
    """This run's private folder in ``root`` (default: the temporary directory), made (and the folders of
    runs that are gone swept there) on first use; raises ``OSError`` when ``root`` takes no folder."""
    global _owner
    with _lock:
        pid = os.getpid()
        if _owner != pid:  # a forked child makes its own
            _folders.clear()
            atexit.register(remove_run_folder)
            _owner = pid
        root = root or tempfile.gettempdir()
        folder = _folders.get(root)
        if folder is not None and os.path.isdir(folder):
            return folder
        sweep_stale(root)
        name = f"{PREFIX}{pid_namespace() or 0}-{pid}-{process_start(pid) or 0}-"
        folder = tempfile.mkdtemp(prefix=name, dir=root)
        os.chmod(folder, MODE)
        _folders[root] = folder
        return folder


def made() -> str | None:
    """This run's folder in the temporary directory, None while none was needed there."""
    return _folders.get(tempfile.gettempdir()) if _owner == os.getpid() else None


def private_dir(prefix: str, root: str | None = None) -> str:
    """A fresh folder (0700) in this run's folder in ``root`` (default: the temporary directory), for one
    piece of zdoctor's work; raises ``OSError``."""
    return tempfile.mkdtemp(prefix=prefix, dir=run_folder(root))


@contextlib.contextmanager
def private_folder(prefix: str, root: str | None = None) -> Iterator[str]:
    """:func:`private_dir`, removed (links in it removed, not followed) when the block ends."""
    folder = private_dir(prefix, root)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_run_folder() -> None:
    """Remove this run's folders and all in them (zdoctor is leaving); links in them are removed, not
    followed."""
    if _owner == os.getpid():
        for folder in list(_folders.values()):
            shutil.rmtree(folder, ignore_errors=True)
        _folders.clear()


def sweep_stale(root: str | None = None) -> list[str]:
    """Remove the run folders under ``root`` (default: the temporary directory and :data:`FALLBACK_PLACES`)
    whose run is gone: real directories (a link is never followed) owned by this user, made in this pid
    namespace, whose process (pid and start time, from the name) no longer runs. Returns the folders
    removed."""
    if root is None:
        places = dict.fromkeys((tempfile.gettempdir(), *FALLBACK_PLACES))
        return [gone for place in places for gone in sweep_stale(place)]
    removed: list[str] = []
    namespace = pid_namespace()
    if namespace is None or process_start(os.getpid()) is None:
        return removed  # no /proc: whether a run is gone cannot be told
    for name, m in named_entries(root, _NAME):
        if m.group(1) != namespace:
            continue
        pid, start = int(m.group(2)), m.group(3)
        if process_start(pid) == start or pid == os.getpid():
            continue  # that run is still going
        full = os.path.join(root, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(full)
            removed.append(full)
    return removed
