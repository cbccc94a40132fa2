"""zdoctor's probe of a training interpreter; runs *inside* that interpreter, standard library only.

zdoctor runs this file as ``PY -B probe_script.py`` with the training environment (no ``-I``, ``-E``,
``-s`` or ``-S``: PYTHONPATH, the user site directory and site-packages must be what the training
sees; ``-B`` keeps the probe from writing bytecode into the user's environment). It never imports
zdoctor. It must parse on any Python (2.7 included) so that it can say "too old" instead of dying
with a SyntaxError, and it must run on Python 3.8+: no f-strings, no annotations, no 3.9+ APIs.

Output: one JSON record per line on stdout, each prefixed with ``@@zdoctor@@ `` and flushed at once,
in stages (hello, basics, torch_import, torch, torch_cuda_check, torch_cuda, deepspeed, done). A
stage that hangs or crashes leaves the earlier records behind. File descriptor 1 is redirected to
stderr before anything heavy runs, so whatever torch prints cannot corrupt the records.

``probe_script.py --trace [ext:PATH ...] [op:PATH ...]`` is the run zdoctor traces under the real loader
when no command is given: the same records, and between them the steps of ``import deepspeed`` as the
training takes them, each a plain JSON line (``{"step": ..., "ok": ...}``, a ``begin`` line first).
The extensions load first, then torch (its records, its CUDA check and ``done`` follow at once), then
deepspeed, every op prebuilt into it, and each JIT-built op; the exit code is 1 when a step failed.
Torch is imported once for both: what the interpreter reports and what the loader did.
"""

import os
import sys
import time

SENTINEL = "@@zdoctor@@ "
T0 = time.time()

# The records go to a private copy of the original stdout; fd 1 and sys.stdout now lead to stderr.
_OUT = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr

# Running a file puts its directory first on sys.path; drop it so zdoctor's own modules cannot
# shadow anything the training imports.
_HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else None
if _HERE and sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    del sys.path[0]

ENV_NAMES = (
    "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "LD_DEBUG", "LIBRARY_PATH", "CPATH",
    "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "VIRTUAL_ENV",
    "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_EXE", "CONDA_SHLVL",
    "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "CUDAHOSTCXX",
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "LDSHARED", "MAX_JOBS",
    "HOME", "XDG_CACHE_HOME", "X_SCLS", "OMP_NUM_THREADS",
)
ENV_PREFIXES = ("TORCH_", "DS_", "NCCL_", "PYTORCH_")
PACKAGES = {
    "torch": ("torch",),
    "deepspeed": ("deepspeed",),
    "numpy": ("numpy",),
    "ninja": ("ninja",),
    "triton": ("triton", "pytorch-triton"),
    "mpi4py": ("mpi4py",),
}


def emit(stage, record):
    """Write one record, on its own line, and flush it at once."""
    import json

    record = dict(record)
    record["stage"] = stage
    record["t"] = round(time.time() - T0, 4)
    line = "\n" + SENTINEL + json.dumps(record, default=repr, sort_keys=True) + "\n"
    data = line.encode("ascii")
    while data:
        n = os.write(_OUT, data)
        data = data[n:]


def safe(errors, key, func, default=None):
    """``func()``, or ``default`` with the exception noted under ``errors[key]``."""
    try:
        return func()
    except Exception as exc:  # a probe reports, it never dies
        errors[key] = "%s: %s" % (type(exc).__name__, exc)
        return default


def mapped_libraries():
    """Shared objects mapped into this process, in first-mapped order (from /proc/self/maps)."""
    seen = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            if path.startswith("/") and ".so" in os.path.basename(path) and path not in seen:
                seen.append(path)
    return seen


def as_list(value):
    return list(value) if isinstance(value, (tuple, list)) else value


def pick(paths, stem):
    return [p for p in paths if os.path.basename(p).startswith(stem)]


def stage_hello():
    emit("hello", {
        "executable": sys.executable,
        "version": sys.version,
        "version_info": list(sys.version_info[:3]),
        "pid": os.getpid(),
    })


def conda_facts():
    prefix = sys.prefix
    base = getattr(sys, "base_prefix", prefix)
    return {
        "env_prefix": os.environ.get("CONDA_PREFIX"),
        "env_name": os.environ.get("CONDA_DEFAULT_ENV"),
        "prefix_is_conda": os.path.isdir(os.path.join(prefix, "conda-meta")),
        "base_prefix_is_conda": os.path.isdir(os.path.join(base, "conda-meta")),
    }


def sysconfig_facts():
    import sysconfig

    names = ("CC", "CXX", "LDSHARED", "CCSHARED", "CFLAGS", "LIBDIR", "Py_ENABLE_SHARED",
             "LDLIBRARY", "INSTSONAME", "MULTIARCH", "EXT_SUFFIX", "SOABI", "HOST_GNU_TYPE")
    return dict((n, sysconfig.get_config_var(n)) for n in names)


def glibc_facts():
    import platform

    out = {"libc_ver": list(platform.libc_ver())}
    try:
        out["confstr"] = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        out["confstr"] = None
    return out


def environment():
    env = {}
    for name in ENV_NAMES:
        if name in os.environ:
            env[name] = os.environ[name]
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIXES):
            env[name] = os.environ[name]
    return env


def dist_version(names):
    try:
        from importlib import metadata
    except ImportError:
        return None, None
    for name in names:
        try:
            dist = metadata.distribution(name)
        except Exception:  # PackageNotFoundError or a broken dist-info
            continue
        return dist.version, name
    return None, None


def package_facts(module, dists):
    """Where ``module`` would be imported from and its distribution version, without importing it."""
    import importlib.util

    out = {"installed": False, "origin": None, "location": None, "version": None, "dist": None}
    spec = importlib.util.find_spec(module)
    if spec is not None:
        out["installed"] = True
        out["origin"] = spec.origin
        locs = list(spec.submodule_search_locations or [])
        out["location"] = locs[0] if locs else (os.path.dirname(spec.origin) if spec.origin else None)
    out["version"], out["dist"] = dist_version(dists)
    return out


def platform_name():
    """``platform.platform()`` on Linux without its child: Python 3.9+ runs ``uname -p`` to learn the
    processor, a process the traced run would count as the training's own."""
    import platform

    uname = os.uname()
    libc = "".join(platform.libc_ver())
    parts = [uname.sysname, uname.release, uname.machine] + (["with", libc] if libc else [])
    return "-".join(part for part in parts if part)


def stage_basics():
    import platform

    errors = {}
    prefix = sys.prefix
    base = getattr(sys, "base_prefix", prefix)
    rec = {
        "executable": sys.executable,
        "realpath": os.path.realpath(sys.executable) if sys.executable else None,
        "version": sys.version,
        "version_info": list(sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "cache_tag": sys.implementation.cache_tag,
        "prefix": prefix,
        "base_prefix": base,
        "exec_prefix": sys.exec_prefix,
        "in_venv": prefix != base or hasattr(sys, "real_prefix"),
        "sys_path": list(sys.path),
        "platform": safe(errors, "platform", platform_name),
        "machine": platform.machine(),
        "byteorder": sys.byteorder,
        "maxsize_64bit": sys.maxsize > 2 ** 32,
    }
    rec["conda"] = safe(errors, "conda", conda_facts, {})
    rec["sysconfig"] = safe(errors, "sysconfig", sysconfig_facts, {})
    rec["glibc"] = safe(errors, "glibc", glibc_facts, {})
    rec["env"] = environment()
    packages = {}
    for module, dists in sorted(PACKAGES.items()):
        packages[module] = safe(errors, "package:" + module,
                                lambda m=module, d=dists: package_facts(m, d), {"installed": None})
    rec["packages"] = packages
    rec["mapped_libs"] = safe(errors, "mapped_libs", mapped_libraries, [])
    rec["errors"] = errors
    emit("basics", rec)
    return packages


def torch_config(torch, errors):
    rec = {}
    rec["version"] = safe(errors, "version", lambda: str(torch.__version__))
    rec["file"] = getattr(torch, "__file__", None)
    version = getattr(torch, "version", None)
    rec["cuda"] = getattr(version, "cuda", None)
    rec["hip"] = getattr(version, "hip", None)
    rec["git_version"] = getattr(version, "git_version", None)
    config = getattr(torch, "__config__", None)
    rec["config"] = safe(errors, "config", lambda: config.show()) if config is not None else None
    rec["parallel_info"] = (safe(errors, "parallel_info", lambda: config.parallel_info())
                            if config is not None and hasattr(config, "parallel_info") else None)
    abi = None
    c_mod = getattr(torch, "_C", None)
    if c_mod is not None and hasattr(c_mod, "_GLIBCXX_USE_CXX11_ABI"):
        abi = bool(c_mod._GLIBCXX_USE_CXX11_ABI)
    elif hasattr(torch, "compiled_with_cxx11_abi"):
        abi = safe(errors, "cxx11_abi", lambda: bool(torch.compiled_with_cxx11_abi()))
    rec["cxx11_abi"] = abi
    mp = getattr(torch, "multiprocessing", None)
    rec["sharing_strategy"] = (safe(errors, "sharing_strategy", lambda: str(mp.get_sharing_strategy()))
                               if mp is not None and hasattr(mp, "get_sharing_strategy") else None)
    return rec


def stage_torch(steps=None):
    """Import torch (timed), then describe it; an import failure is recorded, never raised. With
    ``steps`` (a :class:`Steps`) the import is also its step ``import torch``."""
    import traceback

    emit("torch_import", {"state": "started"})
    if steps is not None:
        steps.begin("import torch")
    t = time.time()
    try:
        import torch
    except BaseException as exc:  # SystemExit and KeyboardInterrupt count as failures too
        if steps is not None:
            steps.failed_with(exc, "import torch")
        rec = {
            "imported": False,
            "seconds": round(time.time() - t, 4),
            "error_type": type(exc).__name__,
            "error": str(exc),
            "traceback": traceback.format_exc(),
        }
        errors = {}
        maps = safe(errors, "mapped_libs", mapped_libraries, [])
        rec.update({"mapped_libs": maps, "libstdcxx": pick(maps, "libstdc++.so"),
                    "libgcc_s": pick(maps, "libgcc_s.so"), "errors": errors})
        emit("torch", rec)
        return None
    seconds = round(time.time() - t, 4)
    if steps is not None:
        steps.succeeded("import torch")
    errors = {}
    rec = {"imported": True, "seconds": seconds}
    rec.update(torch_config(torch, errors))
    maps = safe(errors, "mapped_libs", mapped_libraries, [])
    rec.update({"mapped_libs": maps, "libstdcxx": pick(maps, "libstdc++.so"),
                "libgcc_s": pick(maps, "libgcc_s.so"), "errors": errors})
    emit("torch", rec)
    return torch


def cuda_init_error(cuda, said):
    """Why CUDA did not start: the warning is_available() gave ("CUDA initialization: ..."), else the error
    torch.cuda.init() raises; None when neither says anything."""
    for w in said:
        text = str(getattr(w, "message", w))
        if "CUDA" in text:
            return text[:2000]
    init = getattr(cuda, "init", None)
    if init is None:
        return None
    try:
        init()
    except Exception as exc:  # the text is the fact wanted
        return ("%s: %s" % (type(exc).__name__, exc))[:2000]
    return None


def stage_torch_cuda(torch):
    """torch.cuda.is_available() and friends; a separate stage because a broken driver can hang it."""
    emit("torch_cuda_check", {"state": "started"})
    errors = {}
    cuda = getattr(torch, "cuda", None)
    rec = {"available": None, "device_count": None, "cudnn": None, "nccl": None, "init_error": None}
    if cuda is not None:
        import warnings

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            rec["available"] = safe(errors, "available", lambda: bool(cuda.is_available()))
        if rec["available"]:
            rec["device_count"] = safe(errors, "device_count", cuda.device_count)
        elif getattr(getattr(torch, "version", None), "cuda", None):
            rec["init_error"] = cuda_init_error(cuda, said)
        nccl = getattr(cuda, "nccl", None)
        if nccl is not None and hasattr(nccl, "version"):
            rec["nccl"] = safe(errors, "nccl", lambda: as_list(nccl.version()))
    backends = getattr(torch, "backends", None)
    cudnn = getattr(backends, "cudnn", None) if backends is not None else None
    if cudnn is not None and hasattr(cudnn, "version"):
        rec["cudnn"] = safe(errors, "cudnn", cudnn.version)
    rec["errors"] = errors
    emit("torch_cuda", rec)


def stage_deepspeed(packages):
    """DeepSpeed from its metadata and files only: importing it here could start a JIT build."""
    info = dict(packages.get("deepspeed") or {})
    ops = []
    loc = info.get("location")
    if info.get("installed") and loc and os.path.isdir(loc):
        for root, _dirs, files in os.walk(os.path.join(loc, "ops")):
            for name in files:
                if name.endswith(".so") and len(ops) < 100:
                    ops.append(os.path.join(root, name))
    info["prebuilt_ops"] = sorted(ops)
    emit("deepspeed", info)


AFTER_TORCH = "import torch failed; the launch loads it after torch"


class Steps(object):
    """The traced run's steps, each a plain JSON line on the records' stdout (``begin`` first, then the
    result), so that a step the process died in is seen as begun and never ended."""

    def __init__(self):
        self.failed = False

    def line(self, record):
        import json

        data = (json.dumps(record) + "\n").encode("ascii")
        while data:
            n = os.write(_OUT, data)
            data = data[n:]

    def begin(self, name, **extra):
        record = dict(extra)
        record.update(step=name, begin=True)
        self.line(record)

    def succeeded(self, name, **extra):
        record = dict(extra)
        record.update(step=name, ok=True, error=None)
        self.line(record)

    def failed_with(self, exc, name, **extra):
        import traceback

        self.failed = True
        traceback.print_exc()
        sys.stderr.flush()
        record = dict(extra)
        record.update(step=name, ok=False, error="%s: %s" % (type(exc).__name__, exc))
        self.line(record)

    def skipped(self, name, why, **extra):
        record = dict(extra)
        record.update(step=name, ok=None, error=None, skipped=why)
        self.line(record)

    def take(self, name, func, **extra):
        """Run ``func`` as step ``name``; True when it returned."""
        self.begin(name, **extra)
        try:
            func()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a failing step is the fact wanted
            self.failed_with(exc, name, **extra)
            return False
        self.succeeded(name, **extra)
        return True


def load_extension(path, name):
    """Load the extension module at ``path`` as ``name``, as an ``import`` of it would."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)


def prebuilt_ops(packages):
    """The ops built into the deepspeed package (``DS_BUILD_OPS=1``): ``deepspeed/ops/**/*.so``, 4 deep."""
    out = []
    origin = (packages.get("deepspeed") or {}).get("origin")
    if not origin:
        return out
    root = os.path.join(os.path.dirname(origin), "ops")
    for here, dirs, files in os.walk(root):
        if here[len(root):].count(os.sep) >= 4:
            dirs[:] = []
        for name in sorted(files):
            if name.endswith(".so") and len(out) < 64:
                out.append(os.path.join(here, name))
    return sorted(out)


def module_name(path):
    return os.path.basename(path).split(".")[0]


def trace_steps(steps, args, packages, torch_failed):
    """What follows torch in the traced run: deepspeed, its prebuilt ops, then each JIT-built op."""
    import importlib
    import re

    if (packages.get("deepspeed") or {}).get("installed") is not False:
        if torch_failed:
            steps.skipped("import deepspeed", AFTER_TORCH)
        else:
            steps.take("import deepspeed", lambda: importlib.import_module("deepspeed"))
    else:
        steps.skipped("import deepspeed", "not installed")
    for path in prebuilt_ops(packages):
        name = module_name(path)
        if torch_failed:
            steps.skipped("load prebuilt " + name, AFTER_TORCH, path=path, module=name)
        else:
            steps.take("load prebuilt " + name, lambda p=path, n=name: load_extension(p, n), path=path, module=name)
    mine = "py%d%d" % sys.version_info[:2]
    for path in [a[3:] for a in args if a.startswith("op:")]:
        name = module_name(path)
        tag = os.path.basename(os.path.dirname(os.path.dirname(path)))
        built = re.match(r"(py\d+)t?_", tag)
        if built and built.group(1) != mine:
            steps.skipped("load " + name, "built for %s, this is %s" % (built.group(1), mine), path=path,
                          module=name)
        elif torch_failed:
            steps.skipped("load " + name, AFTER_TORCH, path=path, module=name)
        else:
            steps.take("load " + name, lambda p=path, n=name: load_extension(p, n), path=path, module=name)


def main(args):
    """The records; with ``--trace`` first in ``args``, the traced run's steps too. Returns the exit code."""
    trace = bool(args) and args[0] == "--trace"
    steps = Steps() if trace else None
    stage_hello()
    if sys.version_info < (3, 8):
        emit("too_old", {"version_info": list(sys.version_info[:3])})
        return 0
    packages = stage_basics()
    if steps is not None:
        stage_deepspeed(packages)
        # ``python -c`` puts the working directory first, as the training's own start does its script's.
        sys.path.insert(0, "")
        for path in [a[4:] for a in args if a.startswith("ext:")]:
            name = module_name(path)
            steps.take("load " + name, lambda p=path, n=name: load_extension(p, n), path=path, module=name)
    installed = (packages.get("torch") or {}).get("installed")
    # The traced run tries an import whose lookup itself failed (None), as ``import torch`` would.
    attempt = installed is not False if steps is not None else bool(installed)
    torch = None
    if attempt:
        torch = stage_torch(steps)
        if torch is not None:
            stage_torch_cuda(torch)
    elif steps is not None:
        steps.skipped("import torch", "not installed")
    if steps is None:
        stage_deepspeed(packages)
        emit("done", {})
        return 0
    emit("done", {})
    trace_steps(steps, args, packages, torch_failed=attempt and torch is None)
    return 1 if steps.failed else 0


if __name__ == "__main__":
    code = 0
    traced = sys.argv[1:2] == ["--trace"]
    try:
        code = main(sys.argv[1:])
    except BaseException as exc:  # report how the probe itself died
        import traceback

        code = 1
        try:  # noqa: SIM105 - plain statements only in this script
            emit("probe_error", {"error": "%s: %s" % (type(exc).__name__, exc),
                                 "traceback": traceback.format_exc()})
        except Exception:
            pass
    try:
        sys.stderr.flush()
    finally:
        if traced:  # the traced run ends as the training's own import would: its exit handlers run
            sys.exit(code)
        # Skip interpreter shutdown: torch's exit handlers can hang or crash after the work is done.
        os._exit(0)
