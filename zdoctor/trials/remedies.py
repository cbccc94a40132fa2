"""Remedies for a libstdc++ that lacks a needed version: proposed from the evidence, then proven.

Each plan is an environment change (the exact shell lines to apply it) plus the evidence it rests on.
A plan is ``verified`` only after the failing command (or the default import probe) was re-run in a
subprocess with the change applied, within a time limit, and succeeded. The system libstdc++ is never
replaced or edited.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.core.model import Evidence, Remedy
from zdoctor.core.present import tool_missing
from zdoctor.core.shellquote import shell_quote
from zdoctor.proc import codeowner, scratch
from zdoctor.proc.privilege import RunAs, share_dir
from zdoctor.trials.jitguard import run_guarded

VERIFY_TIMEOUT = 120.0


@dataclass
class Plan:
    """A proposed change to the training environment, with the shell lines that make it."""

    key: str  # ld-library-path | ld-preload | ld-preload-fix | conda-libstdcxx | ...
    title: str
    env_changes: dict[str, str | None] = field(default_factory=dict)  # None: unset
    commands: list[str] = field(default_factory=list)
    undo: list[str] = field(default_factory=list)
    explanation: str = ""
    rests_on: list[str] = field(default_factory=list)
    verifiable: bool = True
    requires_root: bool = False
    verified: bool = False
    verification: str = ""  # tried: what the re-run showed; not tried: why
    tried: bool = False
    # How to try it without changing the machine, when applying the env changes is not the whole of it:
    # {"kind": "link", "name": ..., "target": ...} makes the link in a private temp dir put first on
    # LD_LIBRARY_PATH for the re-run (with "var": that variable names the temp dir instead, or has it put
    # first with "prepend"; see trial_env).
    trial: dict[str, Any] | None = None
    # Tools the commands need that this node lacks (zdoctor.core.present.tool_missing sentences).
    missing: list[str] = field(default_factory=list)

    def apply_to(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with this plan's changes applied."""
        out = dict(env)
        for k, v in self.env_changes.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    def to_remedy(self) -> Remedy:
        reason = self.verification or ("" if self.verifiable else "it would change the machine")
        return Remedy(title=self.title, commands=list(self.commands), verified=self.verified and self.tried,
                      requires_root=self.requires_root, undo=list(self.undo), explanation=self.explanation,
                      tried=self.tried, note=reason, missing=list(self.missing))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        data = dict(d)
        if "tried" not in data:  # recorded before plans said so: a re-run left one of these sentences
            said = str(data.get("verification") or "")
            data["tried"] = bool(data.get("verified")) or said.startswith(("the command", "re-running"))
        return cls(**data)


def split_path_list(value: str | None) -> list[str]:
    """LD_LIBRARY_PATH entries as ld.so splits them (``:`` or ``;``), empty entries kept."""
    if not value:
        return []
    return value.replace(";", ":").split(":")


def export_line(name: str, value: str | None) -> str:
    """``export NAME=value`` (quoted) or ``unset NAME`` when the new value is empty or None."""
    if not value:
        return f"unset {name}"
    return f"export {name}={shell_quote(value)}"  # $'..\xff..' for bytes that are not text


def restore_line(name: str, old: str | None) -> str:
    return export_line(name, old) if old else f"unset {name}"


def variable_plan(key: str, title: str, var: str, value: str | None, env: Mapping[str, str], explanation: str,
                  rests_on: list[str], trial: dict[str, Any] | None = None) -> Plan:
    """A plan that sets one environment variable of the job to ``value`` (unsets it for None), with its
    ``export`` line and the line that puts the old value back."""
    return Plan(key=key, title=title, env_changes={var: value}, commands=[export_line(var, value)],
                undo=[restore_line(var, env.get(var))], explanation=explanation, rests_on=rests_on, trial=trial)


def root_plan(key: str, title: str, commands: list[str], explanation: str, rests_on: list[str], why: str,
              undo: Sequence[str] = ()) -> Plan:
    """A plan that changes the node itself as root, so it is offered untried; ``why`` says what it changes."""
    return Plan(key=key, title=title, commands=commands, undo=list(undo), explanation=explanation,
                rests_on=rests_on, verifiable=False, requires_root=True, verification=why)


def without_entries(value: str | None, drop: Sequence[str]) -> str:
    """``value`` (a colon list) with every entry that names a directory in ``drop`` removed."""
    def norm(p: str) -> str:
        return os.path.normpath(p) if p else p

    dropped = {norm(d) for d in drop}
    return ":".join(e for e in split_path_list(value) if norm(e) not in dropped)


def fix_ld_library_path(env: Mapping[str, str], offending: Sequence[str], rests_on: list[str]) -> Plan:
    """Remove exactly the LD_LIBRARY_PATH entries whose libstdc++ lacks a needed version."""
    new = without_entries(env.get("LD_LIBRARY_PATH"), offending)
    return variable_plan(
        "ld-library-path", f"Drop {', '.join(offending)} from LD_LIBRARY_PATH", "LD_LIBRARY_PATH", new or None, env,
        "ld.so searches LD_LIBRARY_PATH before the cache and system dirs, so an older libstdc++.so.6 there wins. "
        "Removing just those entries keeps every other library the job needs from LD_LIBRARY_PATH. Put the line "
        "in the job's launch script (or the environment's activation) rather than in a global profile.",
        rests_on)


def preload(env: Mapping[str, str], copy: str, drop: Sequence[str], rests_on: list[str],
            key: str = "ld-preload") -> Plan:
    """Preload a libstdc++ copy that satisfies every need, so it is the one loaded first."""
    old = env.get("LD_PRELOAD")
    dropped = {os.path.realpath(d) for d in drop}
    kept = [e for e in (old or "").replace(":", " ").split()
            if os.path.realpath(e) not in dropped and e != copy]
    return variable_plan(
        key, f"Preload {copy} for the training command", "LD_PRELOAD", " ".join([copy, *kept]), env,
        "A preloaded library is loaded before any other, and every later request for libstdc++.so.6 reuses it "
        "(first loaded wins). This copy defines every version the training's libraries need, and libstdc++ is "
        "backward compatible, so older needs are met too. Scope it to the training command; it affects every "
        "program started from that shell.",
        rests_on)


def fix_preload(env: Mapping[str, str], offending: Sequence[str], rests_on: list[str]) -> Plan:
    """Remove the LD_PRELOAD entries that force an old libstdc++."""
    old = env.get("LD_PRELOAD")
    dropped = {os.path.realpath(d) for d in offending} | set(offending)
    kept = [e for e in (old or "").replace(":", " ").split() if e not in dropped and os.path.realpath(e) not in
            dropped]
    return variable_plan(
        "ld-preload-fix", f"Stop preloading {', '.join(offending)}", "LD_PRELOAD", " ".join(kept) or None, env,
        "LD_PRELOAD forces this older libstdc++ into every process before anything else.", rests_on)


def find_conda(prefix: str, env: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """How to run conda for the env at ``prefix``: ``conda`` when it is on the training PATH, else the path of
    the one ``CONDA_EXE`` names or the env's (or its base install's) own; None and where it was looked for
    when there is none."""
    path = env.get("PATH") or os.defpath
    if shutil.which("conda", path=path):
        return "conda", []
    root = os.path.dirname(os.path.dirname(prefix)) if os.path.basename(os.path.dirname(prefix)) == "envs" else None
    candidates = [env.get("CONDA_EXE") or ""] + [os.path.join(p, sub, "conda") for p in (prefix, root) if p
                                                 for sub in ("bin", "condabin")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c, []
    looked = [f"the training PATH ({path})", "CONDA_EXE " + (f"({env['CONDA_EXE']})" if env.get("CONDA_EXE")
                                                               else "(unset)")]
    looked += candidates[1:]
    return None, looked


def conda_upgrade(prefix: str, gcc_release: str | None, rests_on: list[str],
                  env: Mapping[str, str] | None = None) -> Plan:
    """Bring a conda env's libstdc++ up to the GCC release whose libstdc++ has every needed version; where
    this node has no conda (``env`` given: the training environment), the plan says so."""
    major = (gcc_release or "12").split(".")[0]
    spec = f"libstdcxx-ng>={major}"
    conda, looked = find_conda(prefix, env) if env is not None else ("conda", [])
    cmd = shlex.join([conda or "conda", "install", "-y", "-p", prefix, "-c", "conda-forge", spec])
    return Plan(
        key="conda-libstdcxx",
        title=f"Upgrade libstdcxx-ng in the conda env {prefix} to GCC {major}'s",
        commands=[cmd],
        undo=[],
        explanation=(f"The env's own libstdc++.so.6 is older than the GCC {major} runtime the libraries "
                     "need. conda-forge's libstdcxx-ng ships GCC's runtime; a newer one is backward "
                     "compatible with everything already in the env."),
        rests_on=rests_on,
        verifiable=False,
        verification="it needs the network (the conda-forge channel) and changes the env",
        missing=[] if conda else [tool_missing("conda", looked)],
    )


def trial_env(plan: Plan, env: Mapping[str, str], tmp: str) -> dict[str, str]:
    """The re-run's environment for a plan with a ``link`` trial: the link in ``tmp``, first on the path."""
    out = plan.apply_to(env)
    trial = plan.trial or {}
    if trial.get("kind") == "link":
        os.symlink(trial["target"], os.path.join(tmp, trial["name"]))
        var = str(trial.get("var") or "")
        if var and trial.get("prepend") and out.get(var):  # put first on a search list (LIBRARY_PATH)
            out[var] = tmp + ":" + out[var]
        elif var:  # the variable that names the link's directory (TRITON_LIBCUDA_PATH)
            out[var] = tmp
        else:
            old = out.get("LD_LIBRARY_PATH")
            out["LD_LIBRARY_PATH"] = tmp + (":" + old if old else "")
    return out


def verify(plan: Plan, argv: Sequence[str], env: Mapping[str, str], *, timeout: float = VERIFY_TIMEOUT,
           cwd: str | None = None, run_as: RunAs | None = None) -> Evidence:
    """Re-run ``argv`` with the plan applied; set ``plan.verified`` only when it then succeeds.

    A plan with a ``trial`` is tried as the trial says (nothing on the machine changes: the temp
    directory it uses is removed afterwards).
    """
    import tempfile

    how = ""
    if run_as is None:  # the runner's rule, known ahead: the trial's folder is shared with that account
        run_as = codeowner.runs_as(argv, env, cwd)

    try:
        where: str | None = scratch.run_folder()  # swept by the next run should this one be killed
    except OSError:
        where = None
    with tempfile.TemporaryDirectory(prefix="zdoctor-trial-", dir=where) as tmp:
        share_dir(tmp, run_as)  # the re-run reads the trial's links as the user it runs as
        if plan.trial:
            run_env = trial_env(plan, env, tmp)
            named_by = (plan.trial or {}).get("var")
            how = (" (tried without changing anything: the link was made in a private temp directory "
                   + (f"named by {named_by}" if named_by else "put first on LD_LIBRARY_PATH") + " for the re-run)")
        else:
            run_env = plan.apply_to(env)
        ev = run_guarded(list(argv), run_env, timeout=timeout, cwd=cwd, label=f"verify: {plan.title}",
                         run_as=run_as)
    plan.tried = True
    if ev.error:
        plan.verified = False
        plan.verification = f"re-running the command with this change failed: {ev.error}{how}."
    elif ev.exit_code == 0:
        plan.verified = True
        plan.verification = f"the command succeeded with this change (exit 0 in {ev.duration_s:.1f} s){how}."
    else:
        plan.verified = False
        said = [line.strip() for line in (ev.stderr or ev.stdout or "").splitlines() if line.strip()]
        plan.verification = (f"the command still fails with this change (exit code {ev.exit_code}){how}"
                             + (f": {said[-1][:300]}" if said else "") + ".")
    return ev
