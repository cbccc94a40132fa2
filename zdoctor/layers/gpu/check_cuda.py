"""Checks and predicates of CUDA: the driver's CUDA version vs torch's CUDA runtime, the CUDA toolkit
(nvcc) vs torch's CUDA (DeepSpeed's rule), and nvcc's host compiler.

Every check says what it could not check and why (a ``skip`` finding with the reason) instead of
guessing; every mismatch comes with a side-by-side table and remedies whose shell text is quoted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zdoctor.core import packages as pkgmgr
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.nodelayers import BY_ID
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.core.shellquote import shell_quote
from zdoctor.layers.gpu import cuda
from zdoctor.layers.gpu.drivers import driver_ceiling, min_driver_pre11
from zdoctor.layers.python_env.check_dsrelease import nvcc_rule_of_installed
from zdoctor.layers.python_env.dsrules import CURRENT_READ_FROM, parse_version
from zdoctor.readers.gccver import parse_torch_config, version_tuple
from zdoctor.readers.gpufacts import na, nvml_gpus, pip_line
from zdoctor.symptoms.match import ids_for

#: A driver branch that supports every CUDA 12.x and 13.0 runtime.
DRIVER_BRANCH = "580"


# -- what torch says about CUDA -------------------------------------------------------------------------


def torch_cuda(facts: Facts) -> dict[str, Any]:
    """What torch says about CUDA: ``state`` (ok | missing | cpu | rocm | import_failed | unknown),
    ``cuda`` (torch.version.cuda or guessed from the +cuXYZ wheel tag), ``runtime`` (torch's config
    "CUDA Runtime"), ``source``, ``version``, ``available``, ``why``."""
    py = facts.of("pyenv")
    out: dict[str, Any] = {"state": "unknown", "cuda": None, "runtime": None, "source": None, "version": None,
                           "available": None, "why": None}
    if py is None:
        out["why"] = facts.why_not("pyenv")
        return out
    if py.get("error"):
        out["why"] = f"the training interpreter could not be probed: {py['error']}"
        return out
    torch = py.get("torch") or {}
    where = (py.get("target") or {}).get("resolved") or "the training interpreter"
    if not torch.get("installed"):
        out.update(state="missing", why=f"torch is not installed in {where}")
        return out
    imp = (torch.get("import") or {}).get("state")
    out["version"] = torch.get("version") or torch.get("dist_version")
    if imp != "ok":
        tag = (torch.get("dist_version") or "").partition("+")[2]
        if tag.startswith("cu") and tag[2:].isdigit() and len(tag) >= 4:
            out.update(state="import_failed", cuda=wheel_tag_cuda(tag), source=f"wheel tag +{tag}")
        else:
            out.update(state="import_failed")
        out["why"] = f"import torch failed in {where} ({imp})"
        return out
    if torch.get("hip"):
        out.update(state="rocm", why=f"torch {out['version']} is a ROCm build (HIP {torch['hip']})")
        return out
    if not torch.get("cuda"):
        out.update(state="cpu", why=f"torch {out['version']} is a CPU build (torch.version.cuda is None)")
        return out
    out.update(state="ok", cuda=str(torch["cuda"]), source="torch.version.cuda",
               runtime=parse_torch_config(torch.get("config")).get("cuda_runtime"),
               available=(torch.get("cuda_check") or {}).get("available"),
               init_error=(torch.get("cuda_check") or {}).get("init_error"))
    return out


def wheel_tag_cuda(tag: str) -> str:
    """``cu130`` -> ``13.0``, ``cu92`` -> ``9.2``, ``cu1210`` -> ``12.10``: a two-digit major from CUDA 10 on,
    and a minor that may have two digits."""
    digits = tag[2:]
    major, minor = (digits[:-1], digits[-1]) if len(digits) <= 3 else (digits[:2], digits[2:])
    return f"{int(major)}.{int(minor)}"


def _deepspeed(facts: Facts) -> Mapping[str, Any]:
    py = facts.of("pyenv") or {}
    return py.get("deepspeed") or {}

# -- gpu.runtime ----------------------------------------------------------------------------------------


def _wheel_remedy(facts: Facts, max_cuda: str | None) -> Remedy | None:
    wv = cuda.wheel_variant(max_cuda)
    if wv is None:
        return None
    return Remedy(
        title=f"Install a torch built for CUDA {wv['cuda']} (the newest this driver supports)",
        commands=[pip_line(facts, "install", "--upgrade", "--force-reinstall", "torch", "--index-url", wv["index"])],
        verified=None,
        explanation=f"PyTorch publishes CUDA {wv['cuda']} wheels at {wv['index']}. Without a version pin pip "
                    "takes the newest torch that index has; to keep your torch release add `torch==X.Y.Z` if "
                    "that release was built for this CUDA. Reinstall torchvision/torchaudio from the same index, "
                    "and rebuild DeepSpeed's JIT ops afterwards (they are built per torch and CUDA version).")


def _distro(facts: Facts) -> Mapping[str, Any] | None:
    """The node's distribution as a probe recorded it (toolchain, else cuda_stack); None when none did."""
    return ((facts.of("toolchain") or {}).get("distro") or (facts.of("cuda_stack") or {}).get("distro")
            or None)


def _driver_remedy(gpus: list[dict[str, Any]] | None = None,
                   distro: Mapping[str, Any] | None = None) -> list[Remedy]:
    """Upgrade the driver, one alternative per package manager this node may have."""

    ceil = driver_ceiling([g.get("name") or "" for g in gpus or []])
    out = []
    for pm in pkgmgr.managers(distro):
        if ceil["branch"] is not None and ceil["branch"] < int(DRIVER_BRANCH):
            b = ceil["branch"]
            package = pkgmgr.nvidia_driver_package(b, pm.family, pkgmgr.is_ubuntu(distro))
            out.append(Remedy(
                title=f"Upgrade the NVIDIA driver to the {b} branch, the last that supports {ceil['arch']} GPUs "
                      f"(CUDA up to {ceil['max_cuda'] or '?'}) ({pm.label})",
                commands=pm.install(package), requires_root=True, verified=None,
                explanation=f"Later branches ({DRIVER_BRANCH} included) dropped the {ceil['arch']} architecture: "
                            f"they would not drive this GPU. With the {b} branch torch must be built for CUDA "
                            f"{ceil['max_cuda'] or '(unknown)'} or older; a newer CUDA needs newer GPUs."))
            continue
        package = pkgmgr.nvidia_driver_package(DRIVER_BRANCH, pm.family, pkgmgr.is_ubuntu(distro))
        out.append(Remedy(
            title=f"Upgrade the NVIDIA driver (branch {DRIVER_BRANCH} supports CUDA 12.x and 13.0) ({pm.label})",
            commands=pm.install(package), requires_root=True, verified=None,
            explanation=("Ubuntu's own driver package." if package.startswith("nvidia-driver") else
                         "The meta-package of NVIDIA's CUDA repository (developer.download.nvidia.com/compute/cuda/"
                         "repos), which must be configured.")
                        + " A reboot (or reloading the nvidia modules with no process on the GPUs) is needed. "
                        "Datacenter GPUs can instead run a newer CUDA on an older driver through NVIDIA's "
                        "forward-compatibility package (cuda-compat-<major>-<minor>), put first on LD_LIBRARY_PATH."))
    return out


@check("gpu.runtime", title="Driver's CUDA version vs torch's CUDA runtime", probes=("nvml", "pyenv"),
       optional=("toolchain",),
       explains=("cuda-error",))
def check_runtime(facts: Facts, me: CheckSpec) -> list[Finding]:
    tc = torch_cuda(facts)
    nv = facts.of("nvml")
    gpus = nvml_gpus(facts)
    drv_cuda = (nv or {}).get("cuda_driver_version")
    if tc["state"] in ("unknown", "missing", "rocm"):
        return [me.not_checked(tc["why"] or "torch unknown")]
    if tc["state"] == "cpu":
        if gpus:
            rem = [r for r in [_wheel_remedy(facts, drv_cuda)] if r]
            return [me.finding(status="fail",
                               title=f"torch is a CPU build on a node with {count_of(len(gpus), 'GPU')}",
                               detail=f"{tc['why']}: DeepSpeed cannot use the GPUs ('DeepSpeed requires CUDA' / "
                                      "'Torch not compiled with CUDA enabled').", evidence=facts.evidence("nvml"),
                               remedies=rem)]
        return [me.not_checked(f"{tc['why']}, and {facts.why_not('nvml')}")]
    if not tc["cuda"]:
        return [me.not_checked(f"{tc['why']}, and its wheel tag names no CUDA version")]
    if nv is None or not drv_cuda:
        return [me.not_checked(f"torch is built for CUDA {tc['cuda'] or '?'}, but the driver's CUDA version is "
                               f"unknown: {facts.why_not('nvml')}")]
    v = cuda.driver_runtime_verdict(drv_cuda, tc["cuda"])
    rows = [["driver", "NVML nvmlSystemGetDriverVersion", nv.get("driver") or "?"],
            ["CUDA the driver supports", "nvmlSystemGetCudaDriverVersion_v2", v["driver"] or "?"],
            ["torch.version.cuda", tc["source"] or "-", tc["cuda"] or "?"],
            ["torch config 'CUDA Runtime'", "torch.__config__.show()", tc["runtime"] or "n/a"],
            ["torch.cuda.is_available()", "pyenv probe", na(tc["available"])]]
    hl = [1, 2] if v["verdict"] in ("too_old", "minor") else []
    ev = [Evidence.of_table("CUDA: driver vs torch", ["what", "from", "value"], rows, hl)]
    drv_int = nv.get("cuda_driver")
    if v["verdict"] == "too_old":
        rem = [r for r in [_wheel_remedy(facts, drv_cuda)] if r] + _driver_remedy(gpus, _distro(facts))

        pre11 = min_driver_pre11(v["runtime"]) if v.get("no_minor_compat") else None
        return [me.finding(
            status="fail",
            title=f"torch needs CUDA {v['runtime']} but driver {nv.get('driver')} supports only CUDA {v['driver']}",
            detail=(f"Before CUDA 11 there is no minor-version compatibility: CUDA {v['runtime']} needs driver "
                    f">= {pre11 or '(unknown)'} (NVIDIA's table of CUDA releases and their drivers), whatever the "
                    "minor. " if v.get("no_minor_compat") else "") +
                   "A CUDA runtime newer than the driver supports cannot start: CUDA reports "
                   "'CUDA driver version is insufficient for CUDA runtime version' and torch says 'The NVIDIA "
                   f"driver on your system is too old (found version {drv_int})'; torch.cuda.is_available() is "
                   "False and DeepSpeed stops. Either install a torch built for the driver's CUDA, or upgrade the "
                   "driver.", evidence=ev, remedies=rem)]
    lines = []
    status = "ok"
    if v["verdict"] == "minor":
        status = "warn"
        major = cuda.parse_cuda(v["runtime"])[0]  # type: ignore[index]
        need = cuda.MIN_DRIVER_FOR_MAJOR.get(major)
        lines.append(f"torch's CUDA {v['runtime']} is newer than the driver's CUDA {v['driver']} within the same "
                     "major: it runs through CUDA minor-version compatibility (driver >= "
                     f"{need or '?'} for CUDA {major}.x), but kernels that must be JIT-compiled from newer PTX fail "
                     "with 'the provided PTX was compiled with an unsupported toolchain', and features of the newer "
                     "release are missing.")
        if need and version_tuple(nv.get("driver")) < version_tuple(need):
            status = "fail"
            lines.append(f"Driver {nv.get('driver')} is older than {need}, the minimum for CUDA {major}.x: CUDA "
                         "will not start.")
    else:
        lines.append(f"torch's CUDA {v['runtime']} runs on this driver (it supports CUDA up to {v['driver']}).")
    if tc["runtime"] and cuda.parse_cuda(tc["runtime"]) != cuda.parse_cuda(tc["cuda"]):
        lines.append(f"torch's config says 'CUDA Runtime {tc['runtime']}' while torch.version.cuda is {tc['cuda']}.")
    if tc["available"] is False and gpus and v["verdict"] == "ok":
        return [_cuda_start_failed(facts, tc, v, nv, ev, me)]
    if tc["available"] is False and gpus:
        lines.append("torch.cuda.is_available() returned False although the driver lists GPUs.")
    if tc["state"] == "import_failed":
        lines.append(f"{tc['why']}; the CUDA version comes from the {tc['source']}.")
    title = {"ok": f"torch's CUDA {v['runtime']} fits driver {nv.get('driver')} (CUDA {v['driver']})",
             "warn": f"torch's CUDA {v['runtime']} is newer than the driver's CUDA {v['driver']}",
             "fail": f"torch's CUDA {v['runtime']} cannot run on driver {nv.get('driver')}"}[status]
    rem = ([r for r in [_wheel_remedy(facts, drv_cuda)] if r] + _driver_remedy(gpus, _distro(facts))
           if status != "ok" else [])
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev, remedies=rem)]


def _cuda_start_failed(facts: Facts, tc: dict[str, Any], v: dict[str, Any], nv: Mapping[str, Any],
                       ev: list[Evidence], me: CheckSpec) -> Finding:
    """CUDA does not start although torch's CUDA fits the driver: the versions are not the cause."""
    err = cuda.cuda_init_error(tc.get("init_error"))
    lines = [f"torch's CUDA {v['runtime']} runs on driver {nv.get('driver')} (it supports CUDA up to "
             f"{v['driver']}), so the versions are not the cause: the cause is elsewhere.",
             "torch.cuda.is_available() returned False although the driver lists the GPUs."]
    if err is None:
        lines.append("torch gave no error text (the probe recorded none), so the CUDA error number is unknown.")
        head = "CUDA error unknown"
    else:
        lines.append(f"torch said: {err['text']}")
        if err["code"] is not None:
            lines.append(f"CUDA error {err['code']}" + (f" ({err['name']}, '{err['message']}')" if err["name"] else "")
                         + (f": {err['meaning']}." if err["meaning"] else "."))
            if err.get("layer"):
                lay = err["layer"]
                title = BY_ID[lay["layer"]].title if lay["layer"] in BY_ID else lay["layer"]
                lines.append(f"It comes from the layer '{title}' ({lay['layer']}): {lay['cause']}"
                             + (f"; the finding {lay['finding']} reads it on this node" if lay["finding"] else "")
                             + f". Source: {lay['source']}.")
        head = f"CUDA error {err['code']}" if err["code"] is not None else "CUDA error (number not given)"
    lines.append("Also look at CUDA_VISIBLE_DEVICES (gpu.env.visible-devices) and the device nodes /dev/nvidia*.")
    return Finding(id=me.name, status="fail",
                   explains=ids_for(facts, "cuda-error", number=str(err["code"])) if err and err["code"] else [],
                   title=f"CUDA cannot start on driver {nv.get('driver')} ({head}); torch's CUDA {v['runtime']} fits "
                         f"the driver's CUDA {v['driver']}",
                   detail="\n".join(lines), evidence=ev + [Evidence.of_table(
                       "torch's CUDA start error (torch.cuda.is_available() / torch.cuda.init() in the pyenv probe)",
                       ["what", "value"],
                       [["text", (err or {}).get("text") or "none recorded"],
                        ["CUDA error number", na((err or {}).get("code"))],
                        ["CUDA error name", (err or {}).get("name") or "unknown"]], [1])])


# -- gpu.toolkit ----------------------------------------------------------------------------------------


def _toolkit_for(cs: Mapping[str, Any], torch_cuda_v: str, env: dict[str, str],
                 installed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Installed toolkits (with headers) DeepSpeed would accept next to torch's CUDA; exact matches first."""
    good = []
    for t in cs.get("toolkits") or []:
        if not t.get("version") or not t.get("headers"):
            continue
        verdict = cuda.deepspeed_nvcc_rule(t["version"], torch_cuda_v, {}, installed)["verdict"]
        if verdict in ("match", "compatible"):
            good.append((0 if verdict == "match" else 1, t))
    return [t for _, t in sorted(good, key=lambda x: x[0])]


def _cuda_home_remedy(t: dict[str, Any]) -> Remedy:
    path = t["path"]
    return Remedy(title=f"Point CUDA_HOME at {path} (CUDA {t['version']})",
                  commands=[f"export CUDA_HOME={shell_quote(path)}",
                            f"export PATH={shell_quote(os.path.join(path, 'bin'))}:\"$PATH\""],
                  verified=None,
                  explanation="torch and DeepSpeed take $CUDA_HOME first, and run $CUDA_HOME/bin/nvcc. Put both "
                              "lines in the job's launch script; DeepSpeed rebuilds JIT ops when the toolkit changes.")


def _install_toolkit_remedy(torch_cuda_v: str, distro: Mapping[str, Any] | None) -> list[Remedy]:
    ti = cuda.toolkit_install(torch_cuda_v, distro)
    return [Remedy(title=f"Install the CUDA {cuda.cuda_str(torch_cuda_v)} toolkit ({ti['package']}, {how['label']})",
                   commands=[*how["commands"], f"export CUDA_HOME={shell_quote(ti['prefix'] or '/usr/local/cuda')}"],
                   requires_root=True, verified=None,
                   explanation="The package comes from NVIDIA's CUDA repository (developer.download.nvidia.com/"
                               "compute/cuda/repos), which must be configured; it installs next to other toolkits, "
                               "without touching the driver. In a conda env, `conda install -c nvidia cuda-toolkit` "
                               f"with a {cuda.cuda_str(torch_cuda_v)} version label works without root.")
            for how in ti["installs"]]


def _installed_nvcc_rule(facts: Facts) -> dict[str, Any] | None:
    """The nvcc rule read from the installed DeepSpeed (dsrelease probe), when that probe ran."""

    rule = nvcc_rule_of_installed(facts)
    if rule is None:
        ver = parse_version(_deepspeed(facts).get("version"))
        if ver is not None and ver >= CURRENT_READ_FROM:
            return {"state": "current", "skip_env": True}
    return rule


def _why_rule_unread(facts: Facts) -> str:
    rec = ((facts.of("dsrelease") or {}).get("rules") or {}).get("nvcc-minor-tolerance") or {}
    return rec.get("why") or ("its files were not read" if "dsrelease" in facts else "the dsrelease probe did not run")


@check("gpu.toolkit", title="CUDA toolkit (nvcc) vs torch's CUDA", probes=("cuda_stack", "pyenv"),
       explains=("cuda-version-mismatch",),
       findings=("gpu.toolkit.cuda-home", "gpu.toolkit.nvcc-version"))
def check_toolkit(facts: Facts, me: CheckSpec) -> list[Finding]:
    tc = torch_cuda(facts)
    cs = me.require(facts.of("cuda_stack"), facts.why_not("cuda_stack"))
    home, nv = cs.get("cuda_home") or {}, cs.get("nvcc") or {}
    found = f"(CUDA_HOME would be {home.get('path')}, nvcc {nv.get('release') or 'not run'})" if home.get("path") \
        else "(no CUDA toolkit found)"
    if tc["state"] not in ("ok", "import_failed") or not tc["cuda"]:
        return [me.not_checked(f"{tc['why'] or 'torch CUDA unknown'}: DeepSpeed builds "
                               f"no CUDA ops {found}", facts.evidence("cuda_stack"))]
    ds = _deepspeed(facts)
    env = {**(cs.get("env") or {})}
    ev = facts.evidence("cuda_stack")
    rows = [["CUDA_HOME", home.get("source") or "-", home.get("path") or "none"],
            ["nvcc release", nv.get("path") or "-", nv.get("release") or nv.get("error") or "-"],
            ["torch.version.cuda", tc["source"] or "-", tc["cuda"]],
            ["DeepSpeed", "pyenv probe",
             (ds.get("version") or "installed") if ds.get("installed") else "not installed"],
            ["DS_SKIP_CUDA_CHECK", "environment", env.get("DS_SKIP_CUDA_CHECK", "unset")]]
    installed_rule = _installed_nvcc_rule(facts)
    good = _toolkit_for(cs, tc["cuda"], env, installed_rule)
    out: list[Finding] = []
    uses = ("DeepSpeed JIT-builds its CUDA ops (fused_adam, fused_lamb, quantizer, transformer kernels ...) "
            "with this toolkit on first use; cpu_adam and async_io are C++ ops on current DeepSpeed releases and "
            "build without it (older releases ran the CUDA check for cpu_adam too).")
    prebuilt = ds.get("prebuilt_ops") or []
    if prebuilt:
        uses += f" {count_of(len(prebuilt), 'op')} were prebuilt at install time and need no toolkit."
    remedies = [_cuda_home_remedy(t) for t in good[:1]] + _install_toolkit_remedy(tc["cuda"], cs.get("distro"))
    # where the toolkit is
    fid = me.id("cuda-home")
    status = "warn"
    if not home.get("path"):
        out.append(Finding(id=fid, status=status, title="No CUDA toolkit: CUDA ops cannot be compiled",
                           detail=f"torch finds no CUDA_HOME ($CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda), "
                                  f"so DeepSpeed stops a CUDA op build with '{cuda.DS_MISSING_CUDA}' and torch with "
                                  "'CUDA was not found on the system'. " + uses,
                           evidence=ev, remedies=remedies))
    elif not nv.get("exists") or nv.get("error"):
        out.append(Finding(id=fid, status=status, title=f"CUDA_HOME={home['path']} has no working nvcc",
                           detail=f"CUDA_HOME comes from {home.get('source')}. DeepSpeed runs {nv.get('path')} -V and "
                                  f"fails with 'Unable to run {nv.get('path')}, unable to compile CUDA op(s)' "
                                  f"({nv.get('error')}): a runtime-only install has no compiler. " + uses,
                           evidence=ev, remedies=remedies))
    elif not home.get("headers"):
        out.append(Finding(id=fid, status=status,
                           title=f"CUDA_HOME={home['path']} has no CUDA headers (include/cuda_runtime.h)",
                           detail=f"CUDA_HOME comes from {home.get('source')}: torch takes two directories up from "
                                  "the first nvcc on PATH, which is wrong when that nvcc is a wrapper script or a "
                                  "symlink outside the toolkit. nvcc itself runs, but a CUDA op build includes "
                                  f"{home['path']}/include and fails with 'cuda_runtime.h: No such file or "
                                  "directory'. " + uses, evidence=ev, remedies=remedies))
    else:
        out.append(Finding(id=fid, status="ok", title=f"CUDA toolkit at {home['path']} ({home.get('source')})",
                           detail=f"nvcc {nv.get('release')} ({nv.get('build') or '?'}) and the CUDA headers "
                                  "are there.",
                           evidence=ev))
    # nvcc release vs torch
    fid = me.id("nvcc-version")
    if not nv.get("release"):
        out.append(me.not_checked("no nvcc release to compare (see gpu.toolkit.cuda-home)", sub="nvcc-version"))
        return out
    ds_rule = cuda.deepspeed_nvcc_rule(nv["release"], tc["cuda"], env, installed_rule)
    t_rule = cuda.torch_nvcc_rule(nv["release"], tc["cuda"])
    rows += [["DeepSpeed's rule", "assert_no_cuda_mismatch", ds_rule["verdict"]],
             ["torch's rule", "cpp_extension._check_cuda_version", t_rule["verdict"]]]
    hl = [1, 2] if ds_rule["verdict"] in ("mismatch", "skipped") or t_rule["verdict"] == "mismatch" else []
    table = Evidence.of_table("nvcc vs torch", ["what", "from", "value"], rows, hl)
    lines = []
    if ds_rule["message"]:
        lines.append(f"DeepSpeed: {ds_rule['message']}")
    if t_rule["message"]:
        lines.append(f"torch: {t_rule['message']}")
    if ds_rule["verdict"] == "mismatch":
        status = "fail" if ds.get("installed") else "warn"
        title = f"nvcc {nv['release']} does not match torch's CUDA {tc['cuda']}: CUDA op builds fail"
        lines.append("DeepSpeed compares nvcc's major.minor with torch.version.cuda before building any CUDA op; "
                     + (f"DeepSpeed {ds.get('version') or ''} predates the minor-version table (DeepSpeed PR 1139, "
                        "June 2021): it accepts only the same major.minor. "
                        if ds_rule.get("rule") == "old" else
                        "only the same release, or two minors of one major in its compatibility list, pass. ") + uses)
        lines.append("DS_SKIP_CUDA_CHECK=1 silences the check but builds ops against the wrong toolkit: a last "
                     "resort, not a fix.")
        out.append(Finding(id=fid, status=status, title=title, detail="\n".join(lines), evidence=[table, *ev],
                           remedies=remedies, explains=ids_for(facts, "cuda-version-mismatch", nvcc=nv["release"],
                                                               torch=tc["cuda"])))
    elif ds_rule["verdict"] == "skipped":
        out.append(Finding(id=fid, status="warn", title=f"nvcc {nv['release']} vs torch's CUDA {tc['cuda']}: "
                           "mismatch allowed by DS_SKIP_CUDA_CHECK=1", detail="\n".join(lines), evidence=[table, *ev],
                           remedies=remedies))
    elif ds_rule["verdict"] == "compatible" and installed_rule is None and ds.get("installed"):
        lines.append(f"The installed DeepSpeed's own rule was not read ({_why_rule_unread(facts)}): releases before "
                     "DeepSpeed PR 1139 (June 2021) refuse any minor mismatch, and the table grew later (11.7 in "
                     "PR 2211): the current table accepts this pair; the installed release's is unknown.")
        out.append(Finding(id=fid, status="warn", title=f"nvcc {nv['release']} vs torch's CUDA {tc['cuda']}: "
                           "accepted by current DeepSpeed releases; the installed release's rule is unknown",
                           detail="\n".join(lines), evidence=[table], remedies=remedies))
    else:
        title = (f"nvcc {nv['release']} matches torch's CUDA {tc['cuda']}" if ds_rule["verdict"] == "match" else
                 f"nvcc {nv['release']} and torch's CUDA {tc['cuda']}: accepted as compatible by DeepSpeed "
                 f"{ds.get('version') or ''}".rstrip())
        out.append(Finding(id=fid, status="ok", title=title, detail="\n".join(lines) or "Same CUDA release.",
                           evidence=[table]))
    return out


# -- gpu.host-compiler ----------------------------------------------------------------------------------


def _compiler_remedy(cs: Mapping[str, Any], lo: int, hi: int) -> list[Remedy]:
    pairs = [c for c in cs.get("versioned_compilers") or [] if c.get("gcc") and c.get("gxx") and lo <= c["major"] <= hi]
    if pairs:
        c = pairs[-1]
        return [Remedy(title=f"Build CUDA ops with GCC {c['major']} (already installed)",
                       commands=[f"export CC={shell_quote(c['gcc'])}", f"export CXX={shell_quote(c['gxx'])}"],
                       undo=["unset CC CXX"], verified=None,
                       explanation="torch passes -ccbin $CC to nvcc and compiles C++ with $CXX. Set both in the job's "
                                   "launch script; JIT-built ops are rebuilt when the compiler changes.")]
    want = hi
    last_resort = ("As a last resort nvcc accepts an unsupported compiler with "
                   "NVCC_APPEND_FLAGS=-allow-unsupported-compiler, at the risk of miscompiled kernels.")
    out = []
    distro = cs.get("distro")
    for pm in pkgmgr.managers(distro):
        gcc = pkgmgr.versioned_gcc(want, distro, pm.family)
        if gcc is None:
            out.append(Remedy(title=f"Build CUDA ops with GCC {want} from conda-forge ({pm.label} ships no GCC "
                                    f"{want} beside its own compiler)",
                              commands=[f"conda install -y -c conda-forge gcc_linux-64={want} gxx_linux-64={want}"],
                              note="not tried: it installs packages into the active conda environment",
                              explanation="conda-forge's compiler packages set $CC and $CXX when the environment is "
                                          "activated; torch passes -ccbin $CC to nvcc. " + last_resort))
            continue
        commands = [*pm.install(gcc.packages), *([gcc.enable] if gcc.enable else []),
                    f"export CC={gcc.gcc}", f"export CXX={gcc.gxx}"]
        out.append(Remedy(title=f"Install GCC {want} next to the system compiler ({pm.label})", commands=commands,
                          requires_root=True, verified=None,
                          explanation="torch passes -ccbin $CC to nvcc and compiles C++ with $CXX: set them in the "
                                      "job's launch script. " + last_resort))
    return out


@check("gpu.host-compiler", title="Host compiler vs the GCC range nvcc supports",
       probes=("cuda_stack", "toolchain", "pyenv"))
def check_host_compiler(facts: Facts, me: CheckSpec) -> list[Finding]:
    tc = torch_cuda(facts)
    cs, tch = facts.of("cuda_stack"), facts.of("toolchain")
    if cs is None or tch is None:
        return [me.not_checked(facts.why_not("cuda_stack" if cs is None else "toolchain"))]
    if tc["state"] not in ("ok", "import_failed") or not tc["cuda"]:
        return [me.not_checked(f"{tc['why'] or 'torch CUDA unknown'}: no CUDA op is compiled")]
    nv = cs.get("nvcc") or {}
    if not nv.get("release"):
        return [me.not_checked("no working nvcc (see gpu.toolkit.cuda-home)")]
    hc = cs.get("host_config") or {}
    host, jit = tch.get("cuda_host") or {}, tch.get("jit") or {}
    if hc.get("gcc_max"):
        gmax, src = hc["gcc_max"], f"{hc['path']} (#if __GNUC__ > {hc['gcc_max']})"
    else:
        gmax, src = cuda.gcc_max_for(nv["release"])
    gmin = hc.get("gcc_min")
    rows: list[list[str]] = []
    hl, lines = [], []
    status = "ok"
    env = cs.get("env") or {}
    # nvcc's host compiler ($CC, else gcc on PATH)
    label = "nvcc host compiler (-ccbin $CC)" if host.get("source") == "CC" else "nvcc host compiler (gcc on PATH)"
    hmaj = host.get("major")
    verdict = "-"
    if host.get("family") == "gcc" and hmaj is not None and gmax is not None:
        if hmaj > gmax or (gmin and hmaj < gmin):
            status = "fail"
            verdict = f"outside GCC {gmin or ''}..{gmax}"
            hl.append(len(rows))
            err = hc.get("error_line") or (f"#error -- unsupported GNU version! gcc versions later than {gmax} are "
                                          "not supported!")
            lines.append(f"nvcc {nv['release']} accepts GCC up to {gmax} ({src}); the host compiler is GCC "
                         f"{host.get('version')} ({host.get('path')}). Every CUDA op build stops with: {err}")
        else:
            verdict = "supported"
    elif host.get("family") not in (None, "gcc"):
        verdict = f"{host.get('family')}: not checked"
    rows.append([label, host.get("path") or "none", host.get("version") or "?", f"GCC <= {gmax}" if gmax else "?",
                 verdict])
    # torch's own bounds for the C++ compiler of a CUDA extension
    bounds = cuda.TORCH_CUDA_GCC.get(nv["release"])
    skip_abi = str(env.get("TORCH_DONT_CHECK_COMPILER_ABI", "")).upper() in ("ON", "1", "YES", "TRUE", "Y")
    jver = version_tuple(jit.get("version"))
    verdict = "-"
    if bounds and jit.get("family") == "gcc" and jver and not skip_abi:
        lo, hi = bounds
        lo_s, hi_s = ".".join(map(str, lo)), ".".join(map(str, hi))
        name = os.path.basename(jit.get("command") or jit.get("path") or "c++")
        if jver >= hi or jver < lo:
            status = "fail"
            verdict = f"outside >={lo_s}, <{hi_s}"
            hl.append(len(rows))
            side = "greater than the maximum" if jver >= hi else "less than the minimum"
            lines.append(f"torch refuses to JIT-build a CUDA extension with this C++ compiler: 'The current installed "
                         f"version of {name} ({jit.get('version')}) is {side} required version by CUDA "
                         f"{nv['release']}. Please make sure to use an adequate version of {name} "
                         f"(>={lo_s}, <{hi_s}).'")
        else:
            verdict = f"within >={lo_s}, <{hi_s}"
    elif skip_abi:
        verdict = "TORCH_DONT_CHECK_COMPILER_ABI set: torch does not check"
    rows.append(["C++ compiler for extensions ($CXX or c++)", jit.get("path") or "none", jit.get("version") or "?",
                 "torch's CUDA_GCC_VERSIONS" + (f" for {nv['release']}" if bounds else " (no entry)"), verdict])
    ev = [Evidence.of_table("Host compilers vs nvcc", ["layer", "compiler", "version", "allowed", "verdict"], rows, hl),
          *facts.evidence("cuda_stack")]
    if status == "ok":
        if host.get("family") != "gcc":
            return [me.not_checked(f"nvcc's host compiler is {host.get('family') or 'unknown'} "
                                   f"({host.get('path') or host.get('error') or 'not found'}); only GCC ranges are "
                                   "checked.", ev)]
        return [me.finding(status="ok", title=f"Host compiler GCC {host.get('version') or '?'} is supported by "
                           f"nvcc {nv['release']}", detail=f"Limit from {src}.", evidence=ev)]
    hi_major = min([x for x in (gmax, bounds[1][0] - 1 if bounds else None) if x is not None] or [13])
    lo_major = max(gmin or 0, bounds[0][0] if bounds else 0)
    return [me.finding(status="fail", title=f"The host compiler is too new (or old) for nvcc {nv['release']}",
                       detail="\n".join(lines), evidence=ev, remedies=_compiler_remedy(cs, lo_major, hi_major))]



# -- predicates -----------------------------------------------------------------------------------------


@predicate("gpu_torch_without_cuda", doc="torch is missing, or a CPU/ROCm build", probes=("pyenv",))
def gpu_torch_without_cuda(facts: Facts) -> bool:
    return torch_cuda(facts)["state"] in ("missing", "cpu", "rocm")


@predicate("gpu_cuda_start_failed", doc="CUDA does not start although torch's CUDA fits the driver",
           probes=("nvml", "pyenv"))
def gpu_cuda_start_failed(facts: Facts) -> bool:
    tc = torch_cuda(facts)
    drv = (facts.of("nvml") or {}).get("cuda_driver_version")
    return bool(tc["state"] == "ok" and tc["available"] is False and nvml_gpus(facts) and drv
                and cuda.driver_runtime_verdict(drv, tc["cuda"])["verdict"] == "ok")
