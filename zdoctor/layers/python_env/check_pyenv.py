"""Checks and predicates over the ``pyenv`` probe: is the target interpreter usable, does torch import."""

from __future__ import annotations

import shlex

from zdoctor.core.factstypes import PyenvFacts, PyenvTorchImport
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.proc.target import DEFAULT_PYTHON

PLACEHOLDER = "/path/to/env/bin/python"

_ERROR_TITLES = {
    "missing": "Target interpreter not found",
    "not_executable": "Target interpreter is not executable",
    "not_python": "Target is not a Python interpreter",
    "too_old": "Target Python is too old",
    "crashed": "Target interpreter crashed",
    "timeout": "Target interpreter did not answer",
    "failed": "Target interpreter could not be probed",
}



def _target_label(f: PyenvFacts) -> str:
    target = f.get("target") or {}
    return target.get("resolved") or target.get("requested") or DEFAULT_PYTHON


def _how_chosen(f: PyenvFacts) -> str:
    target = f.get("target") or {}
    if target.get("explicit"):
        return f"You named this interpreter with --python {target.get('requested')}."
    return (f"No --python was given, so zdoctor probed {target.get('requested')!r} from the PATH of the "
            "training environment; if your training runs another interpreter (a venv or conda env), "
            "name it with --python.")


def retarget_remedy(f: PyenvFacts) -> Remedy:
    """Re-run zdoctor against the training interpreter: an activated env's python, or a placeholder."""
    cands = f.get("candidates") or {}
    active, on_path = cands.get("active") or [], cands.get("on_path") or []
    cmd = f"zdoctor check --python {shlex.quote(active[0]) if active else PLACEHOLDER}"
    expl = ("zdoctor probes the interpreter your training runs with. Point it at that interpreter: the "
            "python inside the venv or conda env you launch with (`which python` in that shell).")
    if active:
        expl += f" {active[0]} belongs to the environment activated in the training shell."
    others = active[1:] + on_path
    if others:
        expl += " Other interpreters found: " + ", ".join(others) + "."
    return Remedy(title="Point zdoctor at the training interpreter", commands=[cmd], verified=None,
                  explanation=expl)



@check("pyenv.interpreter", title="Target interpreter", probes=("pyenv",))
def check_interpreter(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("pyenv"), "the pyenv probe gave no facts")
    ev = facts.evidence("pyenv", kinds=None)
    if f.get("error") and _late(f):
        sampled = [str(x) for x in f.get("stuck_states") or []]
        lines = [str(f["error"]), *_at_the_limit(f), "", f"Not examined: {_why_not_examined(f)}. Run again when "
                 "the node is less busy."]
        return [me.finding(status="skip", title=f"Target interpreter {_target_label(f)}: not examined: it had not "
                           "answered when zdoctor's time ran out" + (", still running (slow, not hung)" if sampled
                                                                      else ""),
                           detail="\n".join(lines), evidence=ev)]
    if f.get("error"):
        kind = f.get("error_kind") or "failed"
        title = f"{_ERROR_TITLES.get(kind, _ERROR_TITLES['failed'])}: {_target_label(f)}"
        if f.get("signal"):
            title += f" ({f['signal']})"
        detail = f"{f['error']}\n\n{_how_chosen(f)}"
        return [me.finding(status="fail", title=title, detail=detail, evidence=ev,
                           remedies=[retarget_remedy(f)])]
    py = f.get("python") or {}
    version = ".".join(str(p) for p in py.get("version_info") or []) or "?"
    where = "venv" if py.get("in_venv") else None
    conda = py.get("conda") or {}
    if conda.get("prefix_is_conda"):
        where = "conda env" + (f" {conda['env_name']}" if conda.get("env_name") else "")
    title = f"Python {version} at {py.get('executable') or _target_label(f)}" + (f" ({where})" if where else "")
    glibc = (py.get("glibc") or {}).get("confstr") or " ".join((py.get("glibc") or {}).get("libc_ver") or [])
    sc = py.get("sysconfig") or {}
    lines = [
        f"realpath: {py.get('realpath')}",
        f"prefix: {py.get('prefix')} (base prefix {py.get('base_prefix')})",
        f"C library: {glibc or 'unknown'}",
        f"sysconfig CC: {sc.get('CC')!r}, CXX: {sc.get('CXX')!r}",
        _how_chosen(f),
    ]
    return [me.finding(status="ok", title=title, detail="\n".join(lines), evidence=ev)]


def _install_torch_remedy(f: PyenvFacts) -> Remedy:
    exe = _target_label(f)
    return Remedy(
        title="Install torch into this interpreter",
        commands=[f"{shlex.quote(exe)} -m pip install torch"],
        verified=None,
        explanation=("Pick the wheel that matches your CUDA runtime (pytorch.org lists an --index-url per "
                     "CUDA version); the default index serves one CUDA build per release."),
    )


@check("pyenv.torch-import", title="import torch in the target interpreter", probes=("pyenv",))
def check_torch_import(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("pyenv")
    if f is None or f.get("error"):
        return [me.not_checked("the target interpreter is not usable")]
    ev = facts.evidence("pyenv", kinds=None)
    torch = f.get("torch") or {}
    imp = torch.get("import") or {}
    exe = _target_label(f)
    explicit = bool((f.get("target") or {}).get("explicit"))
    if not torch.get("installed"):
        if f.get("timed_out") and "basics" not in (f.get("stages") or []):
            return [me.not_checked("the probe timed out before looking for torch")]
        detail = ("importlib.util.find_spec('torch') finds nothing on this interpreter's sys.path:\n  "
                  + "\n  ".join((f.get("python") or {}).get("sys_path") or []) + f"\n\n{_how_chosen(f)}")
        remedies = [_install_torch_remedy(f)] if explicit else [retarget_remedy(f), _install_torch_remedy(f)]
        return [me.finding(status="fail" if explicit else "warn",
                           title=f"torch is not installed in {exe}", detail=detail, evidence=ev, remedies=remedies)]
    state = imp.get("state")
    if state == "failed":
        line = imp.get("error_line") or imp.get("error") or "unknown error"
        detail = f"{imp.get('error_type')}: {imp.get('error')}"
        if "GLIBCXX_" in line or "CXXABI_" in line:
            detail += (
                "\n\nThe dynamic loader found a libstdc++.so.6 that lacks the version node named above. "
                "libstdc++ is backward compatible: any newer copy satisfies older needs, so the fix is to "
                "make this process load a new enough copy (the loader steps show which copy was loaded "
                "and why), never to rebuild GCC or overwrite the system library.")
        loaded = torch.get("libstdcxx") or []
        if loaded:
            detail += "\n\nlibstdc++ mapped when the import failed: " + ", ".join(loaded)
        return [me.finding(status="fail", title=f"import torch fails: {line}", detail=detail, evidence=ev)]
    if state == "timeout":
        return [_torch_import_late(me, f, exe, ev)]
    if state in ("crashed",):
        sig = imp.get("signal") or f.get("signal") or "a signal"
        detail = (f"The interpreter died with {sig} during `import torch` (exit code {f.get('exit_code')}). "
                  "A native library loaded by torch crashed; the stderr in the evidence shows how far it got.")
        return [me.finding(status="fail", title=f"import torch crashes the interpreter ({sig})",
                           detail=detail, evidence=ev)]
    if state != "ok":
        return [me.not_checked(f"torch import state: {state}")]
    secs = imp.get("seconds")
    title = f"torch {torch.get('version')} imports in {secs:.1f} s" if secs is not None else \
        f"torch {torch.get('version')} imports"
    if torch.get("cuda"):
        title += f" (built for CUDA {torch['cuda']})"
    lines = [f"torch: {torch.get('file')}", f"git: {torch.get('git_version')}",
             f"C++11 ABI: {torch.get('cxx11_abi')}",
             "libstdc++ loaded: " + (", ".join(torch.get("libstdcxx") or []) or "none mapped")]
    cuda = torch.get("cuda_check") or {}
    status = "ok"
    if cuda.get("state") in ("timeout", "crashed", "failed"):
        status = "warn"
        title += f"; torch.cuda.is_available() {'hangs' if cuda['state'] == 'timeout' else 'crashes'}"
        lines.append("torch.cuda.is_available() never returned: the GPU driver or its device nodes are "
                     "not answering; the GPU steps look at the driver.")
    elif cuda.get("state") == "ok":
        lines.append(f"torch.cuda.is_available(): {cuda.get('available')}")
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev)]


def _at_the_limit(f: PyenvFacts) -> list[str]:
    """Where the probe's processes were just before its time limit, and the node's load then."""
    sampled = [str(x) for x in f.get("stuck_states") or []]
    return [*(["Just before the limit:", *(f"  {x}" for x in sampled)] if sampled else []),
            *([f"When the limit came ({f['node_load']})."] if f.get("node_load") else [])]


def _why_not_examined(f: PyenvFacts) -> str:
    """Why a probe that ran out of time without a wait says nothing of the interpreter."""
    if f.get("stuck_states"):
        return ("every process of it was running on a CPU when the limit came: the interpreter was slow (a busy "
                "node, a slow file system), not waiting")
    return "no process of it was sampled before the limit, so nothing shows that it waited"


def _torch_import_late(me: CheckSpec, f: PyenvFacts, exe: str, ev: list[Evidence]) -> Finding:
    """``import torch`` still running at the probe's time limit: a hang only where a process of it waited
    (hang evidence); a run whose processes were all on a CPU was slow (a busy node, a slow disk), not hung."""
    sampled = f.get("stuck_states") or []
    lines = [f"`import torch` in {exe} was still running when the probe's time limit ran out; the process "
             f"group was ended. Records received: {', '.join(f.get('stages') or []) or 'none'}.", *_at_the_limit(f)]
    see = f"To see where it stops, run:\n  {shlex.quote(exe)} -X importtime -c 'import torch'"
    if f.get("waiting"):
        lines += ["", "A process of the import was waiting, not working: a hang inside the import usually waits "
                  "on a filesystem (site-packages or the home directory on NFS/Lustre) or on a lock. " + see]
        return me.finding(status="fail", title="import torch hangs", detail="\n".join(lines), evidence=ev)
    lines += ["", f"Not examined: {_why_not_examined(f)}. Nothing is concluded from zdoctor's own time limit; "
              "run again when the node is less busy, or time the import yourself. " + see]
    return me.finding(status="skip", title="import torch: not examined: it ran out of time, still running "
                      "(slow, not hung)" if sampled else "import torch: not examined: it ran out of time",
                      detail="\n".join(lines), evidence=ev)


# -- predicates ------------------------------------------------------------------------------------

def _torch_import(facts: Facts) -> PyenvTorchImport:
    """How ``import torch`` went in the target interpreter (empty when the probe did not answer)."""
    return ((facts.of("pyenv") or {}).get("torch") or {}).get("import") or {}


def _torch_state(facts: Facts) -> str | None:
    return _torch_import(facts).get("state")


@predicate("interpreter_unusable", doc="the target interpreter is missing, not Python, too old or crashed",
           probes=("pyenv",))
def interpreter_unusable(facts: Facts) -> bool:
    f = facts.of("pyenv")
    return f is None or (bool(f.get("error")) and not _late(f))


def _late(f: PyenvFacts) -> bool:
    """The interpreter had not answered when zdoctor's time ran out, and nothing of it was waiting."""
    return f.get("error_kind") == "timeout" and not f.get("waiting")


@predicate("interpreter_late", doc="the target interpreter had not answered when zdoctor's time ran out, still "
           "working (not waiting): not examined", probes=("pyenv",))
def interpreter_late(facts: Facts) -> bool:
    f = facts.of("pyenv")
    return f is not None and bool(f.get("error")) and _late(f)


@predicate("torch_missing", doc="torch is not installed in the target interpreter", probes=("pyenv",))
def torch_missing(facts: Facts) -> bool:
    f = facts.of("pyenv")
    return bool(f and not f.get("error") and "basics" in (f.get("stages") or [])
                and (f.get("torch") or {}).get("installed") is False)


@predicate("torch_import_failed", doc="import torch raised or crashed the interpreter", probes=("pyenv",))
def torch_import_failed(facts: Facts) -> bool:
    return _torch_state(facts) in ("failed", "crashed")


@predicate("torch_import_hung", doc="import torch did not finish within the time limit and a process of it was "
           "waiting (sleeping or stuck in the kernel), not working", probes=("pyenv",))
def torch_import_hung(facts: Facts) -> bool:
    return _torch_state(facts) == "timeout" and bool((facts.of("pyenv") or {}).get("waiting"))


@predicate("torch_import_late", doc="import torch ran out of zdoctor's time while working on a CPU, or with no "
           "sample of it: not examined", probes=("pyenv",))
def torch_import_late(facts: Facts) -> bool:
    return _torch_state(facts) == "timeout" and not (facts.of("pyenv") or {}).get("waiting")


@predicate("glibcxx_error", doc="the torch import error names a missing GLIBCXX/CXXABI version",
           probes=("pyenv",))
def glibcxx_error(facts: Facts) -> bool:
    line = _torch_import(facts).get("error_line") or ""
    return "not found" in line and ("GLIBCXX_" in line or "CXXABI_" in line)
