"""``shm_access``: can the training user create files in /dev/shm (permissions, not size)."""

from __future__ import annotations

import os
import stat
import tempfile
from typing import Any

from zdoctor.core.factstypes import ShmAccessFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.proc import asuser, scratch
from zdoctor.proc.target import target_of
from zdoctor.proc.trainuser import training_user


def shm_access(path: str = "/dev/shm", user: dict[str, str] | None = None) -> dict[str, Any]:
    """Mode, owner and a real create/unlink test of ``path`` as the training user ``user`` (from
    ``training_user``): in this process when that is the user zdoctor runs as, else in a child switched to
    that user (root only; otherwise ``write_test`` is None and ``skipped`` says why)."""
    me = os.geteuid()
    name = (user or {}).get("name")
    who = asuser.identity(name) if name else None
    out: dict[str, Any] = {"path": path, "exists": os.path.isdir(path), "mode": None, "uid": None, "sticky": None,
                           "write_test": None, "error": None, "skipped": None, "euid": me,
                           "user": name, "user_uid": who["uid"] if who else None,
                           "user_rule": (user or {}).get("rule"), "tested_as": None}
    if not out["exists"]:
        out["error"] = "not a directory"
        return out
    st = os.stat(path)
    out.update(mode=oct(stat.S_IMODE(st.st_mode)), uid=st.st_uid, sticky=bool(st.st_mode & stat.S_ISVTX))
    if name and who is None:
        out["skipped"] = f"the training user {name!r} is not a user on this machine"
        return out
    if who is not None and who["uid"] != me:
        res = asuser.can_create(path, str(who["name"]))
        if res["ok"] is None:
            out["skipped"] = f"not tested as {who['name']}: {res['error']}"
            return out
        out.update(write_test=res["ok"], error=res["error"], tested_as=who["name"])
        return out
    out["tested_as"] = name or str(me)
    try:
        # in this run's folder there (made by the same right to create in it), swept should the run be killed
        fd, tmp = tempfile.mkstemp(prefix="shm-", dir=scratch.run_folder(path))
        os.close(fd)
        os.unlink(tmp)
        out["write_test"] = True
    except OSError as exc:
        out["write_test"] = False
        out["error"] = f"{exc.strerror or exc}"
    return out


@probe("shm_access", title="Can the training user create files in /dev/shm", timeout=10, facts=ShmAccessFacts)
def shm_access_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    job = target_of(host)
    options = dict(job.options)
    user = training_user(dict(job.env), user=str(options["user"]) if options.get("user") else None,
                         python=job.python, python_explicit=job.python_explicit)
    f = shm_access(user=user)
    result = f["skipped"] or ("ok" if f["write_test"] else f["error"])
    return f, [Evidence.note("/dev/shm access", f"mode {f['mode']}, owner uid {f['uid']}, training user "
                                                f"{f['user']} ({f['user_rule']}), create test as "
                                                f"{f['tested_as'] or 'nobody'}: {result}")]
