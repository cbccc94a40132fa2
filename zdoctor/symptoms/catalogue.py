"""The catalogue of known failure messages, as data with sources.

Each signature is a regular expression over one line of what the user saw (a command's output, a log, a
pasted message) -> the symptom kind the ledger matches findings on, the fields that kind is matched by
(the named groups), what the message means, which checks confirm it on a node, and what to read next.
Where no check of zdoctor can confirm it (``confirm`` empty), the ledger still names the likely cause,
marked "from the message only, not confirmed on this node".

Order matters: the first signature that matches a line names it, so the specific ones come first.
``sources`` say where the message text comes from (the code that prints it, or its documentation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Signature:
    """One known failure message."""

    id: str
    kind: str
    pattern: str
    layer: str
    meaning: str
    read_next: str
    sources: tuple[str, ...]
    confirm: tuple[str, ...] = ()
    #: Fixed fields added to the named groups (``{"signal": "9"}`` for a "Killed" line).
    fields: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: The messages this one wraps (signature ids; :data:`ANY_ERROR` for any error of the same run): it is
    #: explained by what explains the inner message (DeepSpeed's op builder around torch's, a launcher's
    #: exit line around a rank's error).
    wraps: tuple[str, ...] = ()

    @property
    def regex(self) -> re.Pattern[str]:
        return _compiled(self.pattern)

    def search(self, line: str) -> re.Match[str] | None:
        """The match in ``line``'s head or tail (:func:`pieces`), or None: the only way a line is matched."""
        return next((m for m in (self.regex.search(p) for p in pieces(line)) if m is not None), None)


#: Only this much of a line's head (and as much of its tail) is matched: every pattern fails in time linear in
#: what it reads, and this bounds what it reads, whatever a log or a command prints on one line.
MATCH_LIMIT = 4096


def pieces(line: str) -> tuple[str, ...]:
    """What of ``line`` is matched: all of it, or its head and its tail (:data:`MATCH_LIMIT` each)."""
    return (line,) if len(line) <= MATCH_LIMIT else (line[:MATCH_LIMIT], line[-MATCH_LIMIT:])


#: In ``wraps``: any other error seen in the same place (the launcher's line around whatever a rank raised).
ANY_ERROR = "*"

_CACHE: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    found = _CACHE.get(pattern)
    if found is None:
        found = _CACHE[pattern] = re.compile(pattern)
    return found


GLIBC_SOURCE = "glibc elf/dl-version.c (match_symbol: \"version `%s' not found (required by %s)\")"
DL_LOOKUP = "glibc elf/dl-lookup.c (_dl_lookup_symbol_x: \"undefined symbol: %s\")"
#: The C++ runtime's default terminate handler, which prints both terminate lines.
VTERMINATE = "GCC libstdc++-v3/libsupc++/vterminate.cc (__verbose_terminate_handler: "

SIGNATURES: tuple[Signature, ...] = (
    # -- the loader ---------------------------------------------------------------------------------
    Signature(
        id="loader.glibcxx-version", kind="version-not-found", layer="loader",
        pattern=r"(?<![^\s:'\"])(?P<library>[^\s:'\"]*libstdc\+\+\.so[.\d]*): "
                r"version `(?P<version>(?:GLIBCXX|CXXABI)_[\d.]+)' not found \(required by (?P<object>[^)\s]+)\)",
        meaning="the libstdc++ the process loaded is older than the one the named object was built against: "
                "an older copy earlier on the search path (LD_LIBRARY_PATH, an RPATH, a conda prefix) won",
        read_next="which libstdc++ the process really loaded (LD_DEBUG=libs), and every copy on the node",
        confirm=("libs.glibcxx", "libs.live"), sources=(GLIBC_SOURCE,)),
    Signature(
        id="loader.glibc-version", kind="version-not-found", layer="loader",
        pattern=r"(?<![^\s:'\"])(?P<library>[^\s:'\"]*(?:libc\.so\.6|libm\.so\.6|libpthread\.so\.0)): "
                r"version `(?P<version>GLIBC_[\d.]+)' not found \(required by (?P<object>[^)\s]+)\)",
        meaning="the named object was built against a newer glibc than this host has; only a build for an older "
                "glibc (or a newer OS) helps, not another libstdc++",
        read_next="the host's glibc version and which package owns the object that needs the newer one",
        confirm=("libs.glibc",), sources=(GLIBC_SOURCE,)),
    Signature(
        id="loader.version-not-found", kind="version-not-found", layer="loader",
        pattern=r"(?<![^\s:'\"])(?P<library>[^\s:'\"]+): version `(?P<version>[^'\n]{1,200})' not found "
                r"\(required by (?P<object>[^)\s]+)\)",
        meaning="the library the loader found lacks a symbol version the named object needs",
        read_next="which copy of the library the loader picked, and which copies exist",
        confirm=("libs.live",), sources=(GLIBC_SOURCE,)),
    Signature(
        id="loader.undefined-nccl-symbol", kind="undefined-symbol", layer="cuda-lookup",
        pattern=r"(?<![^\s:'\"(=\[,])(?P<object>/[^\s:]+\.so[.\d]*): undefined symbol: (?P<symbol>nccl[A-Za-z_]\w*)",
        meaning="a library of torch needs an NCCL function the libnccl.so.2 loaded before it lacks: an older NCCL "
                "(a system libnccl2 or a CUDA toolkit's copy, on LD_LIBRARY_PATH or in the ld cache) shadows the "
                "nvidia-nccl wheel torch was built with (ncclCommRegister, for one, is in NCCL 2.19 and later)",
        read_next="which libnccl.so.2 the process loads (LD_DEBUG=libs) against the nvidia-nccl-cu* wheel's, and "
                  "the LD_LIBRARY_PATH entries before it",
        confirm=("libs.symbols", "cuda.lookup"),
        sources=(DL_LOOKUP, "NCCL src/nccl.h.in (ncclCommRegister / ncclCommDeregister, from NCCL 2.19)")),
    Signature(
        id="loader.undefined-symbol", kind="undefined-symbol", layer="loader",
        pattern=r"(?<![^\s:'\"(=\[,])(?P<object>/[^\s:]+\.so[.\d]*): undefined symbol: (?P<symbol>[A-Za-z_$][\w$.@]*)",
        meaning="an extension refers to a symbol none of the libraries loaded before it define: built against "
                "another torch (or C++11 ABI), or a library it needs was shadowed or never linked",
        read_next="the symbol demangled, which library should define it, and the ABI flag of torch",
        confirm=("libs.symbols",),
        sources=(DL_LOOKUP,)),
    # -- the CUDA library lookup (layer cuda-lookup) ---------------------------------------------------
    Signature(
        id="link.cannot-find-lcuda", kind="link-library-missing", layer="cuda-lookup",
        pattern=r"(?:/usr/bin/)?ld(?:\.\w+)?: cannot find -l(?P<library>cuda)\b",
        meaning="the link (triton's launcher build, an op linking the driver API) wants the unversioned "
                "libcuda.so in a -L directory or the compiler's library path; the driver installs libcuda.so.1, "
                "and the ld.so cache does not count for -l",
        read_next="where libcuda.so.1 is, whether libcuda.so is beside it, and the toolkit's stubs directory",
        confirm=("cuda.lookup",),
        sources=("GNU binutils ld/ldfile.c (\"cannot find -l%s\")",
                 "triton python/triton/runtime/build.py (_build: -lcuda with -L libcuda_dirs())")),
    Signature(
        id="loader.cannot-open-cuda", kind="library-not-found", layer="cuda-lookup",
        pattern=r"(?P<library>lib(?:cudart|cublas|cublasLt|nvrtc|nvJitLink|cusparse|cufft|curand|cusolver|cudnn"
                r"|cupti|nvToolsExt)\w*\.so[.\d]*): cannot open shared object file: No such file or directory",
        meaning="an extension needs a CUDA library soname no directory the loader searches holds: built against "
                "another CUDA major than this environment's torch (libcudart.so.11.0 in a CUDA 12 environment), "
                "or the nvidia-* wheel that ships it is not installed",
        read_next="the CUDA sonames each extension needs against torch.version.cuda and the nvidia-* wheels",
        confirm=("cuda.lookup",),
        sources=("glibc elf/dl-load.c (_dl_map_object: \"cannot open shared object file\")",)),
    Signature(
        id="cuda.stub-library", kind="cuda-stub", layer="cuda-lookup",
        pattern=r"CUDA driver is a stub library",
        meaning="the process loaded the CUDA toolkit's stub libcuda (lib64/stubs, meant only for linking) "
                "instead of the driver's: the stubs directory is on LD_LIBRARY_PATH or in the ld cache",
        read_next="which libcuda.so.1 the training process resolves and the LD_LIBRARY_PATH entries before it",
        confirm=("cuda.lookup",), fields=(("number", "34"),),
        sources=("CUDA Driver API CUresult: 34 CUDA_ERROR_STUB_LIBRARY (\"CUDA driver is a stub library\")",
                 "CUDA Runtime API cudaError_t: 34 cudaErrorStubLibrary")),
    Signature(
        id="loader.cannot-open", kind="library-not-found", layer="loader",
        pattern=r"(?<![\w.+-])(?P<library>[\w.+-]+\.so[.\d]*): cannot open shared object file: "
                r"No such file or directory",
        meaning="the loader did not find the library on any path it searched (RPATH, LD_LIBRARY_PATH, RUNPATH, "
                "ld.so.cache, the default directories)",
        read_next="the paths the loader tried in order (LD_DEBUG=libs), and where the library really is",
        sources=("glibc elf/dl-load.c (_dl_map_object: \"cannot open shared object file\")",)),
    Signature(
        id="link.undefined-reference", kind="undefined-reference", layer="build",
        pattern=r"undefined reference to [`'](?P<symbol>[^'`]+)'",
        meaning="the link of a JIT-built op could not resolve a symbol: an ABI mismatch (_GLIBCXX_USE_CXX11_ABI) "
                "or a library missing from the link line",
        read_next="the op's build log, the symbol demangled and torch's C++11 ABI flag",
        confirm=("libs.symbols",),
        sources=("GNU binutils ld/ldmisc.c (\"undefined reference to `%s'\")",)),
    Signature(
        id="link.cannot-find-lib", kind="link-library-missing", layer="build",
        pattern=r"(?:/usr/bin/)?ld(?:\.\w+)?: cannot find -l(?P<library>[\w.+-]+)",
        meaning="the linker found no lib<name>.so (the unversioned development link) or lib<name>.a on its "
                "search path; a versioned .so.1 alone does not satisfy -l",
        read_next="where the library's versioned file is and whether the unversioned link (or the toolkit's "
                  "stubs directory) exists",
        sources=("GNU binutils ld/ldfile.c (\"cannot find -l%s\")",)),
    # -- the build ----------------------------------------------------------------------------------
    Signature(
        id="build.compiler-pass-missing", kind="compiler-pass-missing", layer="build",
        pattern=r"fatal error: cannot execute [\u2018'](?P<program>cc1plus|cc1|collect2|as|ld)[\u2019']: \w{1,16}: No "
                r"such file or directory",
        meaning="the compiler driver (gcc, g++, c++) runs, but one of its own passes is not installed where it looks "
                "for it: cc1plus, the C++ compiler proper, comes with g++ (a gcc without g++ cannot compile C++)",
        read_next="`<compiler> -print-prog-name=cc1plus` (a bare name: not found) and which package of this "
                  "distribution holds it for the driver's GCC version",
        confirm=("toolchain.jit-prereq",),
        sources=("GCC gcc/gcc.cc (execute: \"cannot execute %qs: %s: %m\", the pass's name quoted in the locale's "
                 "quotes)",)),
    Signature(
        id="build.missing-header", kind="missing-header", layer="build",
        pattern=r"fatal error: (?P<header>[\w./+-]+\.h(?:pp)?): No such file or directory",
        meaning="a header the op's build includes is not installed (Python.h: the Python development package; "
                "libaio.h: libaio's development package; cuda_runtime.h: the CUDA toolkit)",
        read_next="which package provides the header on this distribution",
        confirm=("toolchain.jit-prereq",),
        sources=("GCC libcpp/files.cc (open_file_failed: \"%s: No such file or directory\")",)),
    Signature(
        id="build.ninja-required", kind="ninja-missing", layer="build",
        pattern=r"RuntimeError: Ninja is required to load C\+\+ extensions",
        meaning="torch's JIT builder found no ninja on the launching shell's PATH",
        read_next="which ninja the launch resolves, and whether it runs",
        confirm=("toolchain.jit-prereq",),
        sources=("PyTorch torch/utils/cpp_extension.py (verify_ninja_availability)",)),
    Signature(
        id="deepspeed.jit-ninja", kind="op-jit-ninja", layer="build",
        pattern=r"Unable to JIT load the (?P<op>[\w.-]+) op due to ninja not being installed",
        meaning="DeepSpeed's op builder wraps torch's ninja check: torch found no ninja on the launching shell's "
                "PATH that starts (none installed, or one that fails to start, such as a ninja built against a "
                "newer libstdc++ than the one the shell's LD_LIBRARY_PATH gives it)",
        read_next="which ninja the launch resolves, and whether it runs",
        confirm=("toolchain.jit-prereq",), wraps=("build.ninja-required",),
        sources=("DeepSpeed op_builder/builder.py (OpBuilder.jit_load: \"Unable to JIT load the {name} op due to "
                 "ninja not being installed.\", raised from torch's verify_ninja_availability)",)),
    Signature(
        id="build.no-space", kind="no-space", layer="build",
        pattern=r"(?:\bfatal error: error (?:writing to|closing) (?P<path>\S{1,4096}?)|\bFatal error: can't write \d+ "
                r"bytes to section \S{1,512} of (?P<object>\S{1,4096}?)|\bfinal link failed)(?::|: ')? ?No space left "
                r"on device",
        meaning="the compiler, the assembler or the linker could not write its output: the folder it writes to is "
                "full (GCC's temporary files go to TMPDIR, else /tmp; the objects to the op's build folder)",
        read_next="how full TMPDIR (or /tmp) and the op's build folder are, and a folder with room for TMPDIR",
        confirm=("toolchain.jit-prereq",),
        sources=("GCC gcc/toplev.cc and gcc/diagnostic.cc (\"error writing to %s\", \"error closing %s\")",
                 "GNU binutils gas/write.c (\"can't write %ld bytes to section %s of %s: '%s'\")",
                 "GNU binutils ld/ldlang.c (\"final link failed\")")),
    Signature(
        id="build.extension-failed", kind="build-failed", layer="build",
        pattern=r"RuntimeError: Error building extension '(?P<op>[\w.-]+)'",
        meaning="the JIT build of a DeepSpeed op failed; the real cause is in the compiler lines above it",
        read_next="the first 'error:' line of the build output (zdoctor reads it as a symptom of its own), and the "
                  "op's build directory",
        wraps=(ANY_ERROR,),
        sources=("PyTorch torch/utils/cpp_extension.py (_run_ninja_build: \"Error building extension '{}'\")",)),
    Signature(
        id="torch.cuda-mismatch", kind="cuda-version-mismatch", layer="build",
        pattern=r"The detected CUDA version \((?P<nvcc>[\d.]+)\) mismatches the version that was used to compile"
                r" ?PyTorch \((?P<torch>[\d.]+)\)",
        meaning="torch refuses to build a C++/CUDA extension with an nvcc of another major release than the CUDA "
                "torch was built with",
        read_next="which nvcc CUDA_HOME resolves against torch.version.cuda",
        confirm=("gpu.toolkit",),
        sources=("PyTorch torch/utils/cpp_extension.py (CUDA_MISMATCH_MESSAGE, raised by _check_cuda_version)",)),
    Signature(
        id="deepspeed.cuda-mismatch", kind="cuda-version-mismatch", layer="build",
        pattern=r"Installed CUDA version (?P<nvcc>[\d.]+) does not match the version torch was compiled with "
                r"(?P<torch>[\d.]+)",
        meaning="DeepSpeed refuses to build CUDA ops with an nvcc of another release than torch's CUDA",
        read_next="which nvcc CUDA_HOME resolves and the release's compatibility table",
        confirm=("gpu.toolkit",),
        sources=("DeepSpeed op_builder/builder.py (assert_no_cuda_mismatch)",)),
    Signature(
        id="deepspeed.async-io-libaio", kind="libaio-missing", layer="storage",
        pattern=r"async_io requires the dev libaio \.so object and headers but these were not found",
        meaning="DeepSpeed's async_io op (NVMe offload) cannot build without libaio's development files",
        read_next="libaio on this node and the package that provides it",
        confirm=("storage.libaio",),
        sources=("DeepSpeed op_builder/async_io.py (AsyncIOBuilder.is_compatible warning)",)),
    Signature(
        id="deepspeed.cpuadam-attr", kind="op-not-built", layer="build",
        pattern=r"'DeepSpeedCPUAdam' object has no attribute 'ds_opt_adam'",
        meaning="a follow-on error: DeepSpeedCPUAdam's destructor ran after the cpu_adam op failed to load or "
                "build; the first error above it is the cause",
        read_next="the first error of the run (the op's build or load)",
        sources=("DeepSpeed deepspeed/ops/adam/cpu_adam.py (__del__ uses self.ds_opt_adam)",)),
    Signature(
        id="deepspeed.no-launcher", kind="no-launcher", layer="launcher",
        pattern=r"Not using the DeepSpeed or dist launchers, attempting to detect MPI environment",
        meaning="the script called deepspeed.init_distributed() without RANK/WORLD_SIZE/MASTER_ADDR set: it was "
                "not started by deepspeed, torchrun or a dist launcher, so DeepSpeed falls back to MPI discovery "
                "(and needs mpi4py)",
        read_next="how the job was launched and the environment each rank got",
        confirm=("launcher.env",),
        sources=("DeepSpeed deepspeed/comm/comm.py (init_distributed -> mpi_discovery)",)),
    Signature(
        id="deepspeed.no-slot", kind="hostfile-slot", layer="launcher",
        pattern=r"No slot '(?P<slot>\d+)' specified on host '(?P<host>[^'{}]+)'",
        meaning="an --include/--exclude filter names a GPU slot the hostfile does not give that host",
        read_next="the hostfile's slots= for that host and the --include/--exclude string",
        confirm=("launcher.devices",),
        sources=("DeepSpeed deepspeed/launcher/runner.py (parse_resource_filter)",)),
    Signature(
        id="python.no-mpi4py", kind="module-missing", layer="python",
        pattern=r"ModuleNotFoundError: No module named '(?P<module>mpi4py)'",
        meaning="DeepSpeed fell back to MPI discovery (no launcher environment) and mpi4py is not installed; "
                "launching with deepspeed or torchrun is the usual fix, not installing mpi4py",
        read_next="how the job was launched",
        confirm=("launcher.env",),
        sources=("DeepSpeed deepspeed/comm/comm.py (mpi_discovery imports mpi4py)",)),
    Signature(
        id="deepspeed.assertion-batch", kind="ds-config-assertion", layer="deepspeed",
        pattern=r"(?P<text>(?:train_batch_size|Micro batch size per gpu|Gradient accumulation steps)[^\n]{0,500}"
                r"(?:not equal|has to be greater than 0|must be))",
        meaning="the ds_config's batch sizes do not satisfy train_batch_size = micro_batch_per_gpu x "
                "gradient_accumulation_steps x world_size",
        read_next="the three batch settings and the world size the launch gives",
        sources=("DeepSpeed deepspeed/runtime/config.py (_batch_assertion)",)),
    # -- CUDA and the driver ------------------------------------------------------------------------
    Signature(
        id="cuda.driver-too-old", kind="cuda-error", layer="cuda",
        pattern=r"The NVIDIA driver on your system is too old \(found version (?P<driver_cuda>\d+)\)",
        meaning="torch's CUDA runtime needs a newer driver than the one installed (cudaErrorInsufficientDriver, "
                "35); the number is the CUDA version the driver supports (12080: CUDA 12.8)",
        read_next="the driver's CUDA version against torch.version.cuda",
        confirm=("gpu.runtime",), fields=(("number", "35"),),
        sources=("PyTorch c10/cuda/CUDAFunctions.cpp (device_count_impl on cudaErrorInsufficientDriver: \"The NVIDIA "
                 "driver on your system is too old (found version %d)\")",
                 "CUDA Runtime API cudaError_t: 35 cudaErrorInsufficientDriver")),
    Signature(
        id="cuda.init-error", kind="cuda-error", layer="cuda",
        pattern=r"(?:cudaGetDeviceCount\(\)|CUDA)[^\n]{0,300}?Error (?P<number>\d+): (?P<name>[^\n(]{1,200}?)"
                r"(?: \(Triggered internally|$)",
        meaning="CUDA could not initialise (the number says which layer: 802 Fabric Manager not running on an "
                "NVSwitch system, 803 driver/user-space mismatch, 804 a forward-compatibility libcuda on a GPU "
                "that does not support it, 35 driver too old for the runtime, 100 no GPU visible, 999 unknown, "
                "often a driver in a bad state)",
        read_next="the driver's kernel module and user-space versions, which libcuda.so.1 the process loads, and "
                  "the kernel log",
        confirm=("gpu.runtime", "gpu.driver"),
        sources=("PyTorch c10/cuda/CUDAFunctions.cpp (device_count_impl: \"CUDA initialization: Unexpected "
                 "error from cudaGetDeviceCount() ... Error %d: %s\")",
                 "CUDA Runtime API cudaError_t: 802 cudaErrorSystemNotReady, 803 cudaErrorSystemDriverMismatch, "
                 "804 cudaErrorCompatNotSupportedOnDevice")),
    Signature(
        id="cuda.driver-insufficient", kind="cuda-error", layer="cuda",
        pattern=r"CUDA driver version is insufficient for CUDA runtime version",
        meaning="torch's CUDA runtime is newer than the driver supports (cudaErrorInsufficientDriver, 35)",
        read_next="the driver's CUDA version against torch.version.cuda",
        confirm=("gpu.runtime",), fields=(("number", "35"),),
        sources=("CUDA Runtime API cudaError_t: 35 cudaErrorInsufficientDriver",)),
    # -- the driver's parts: CUDA start errors without their number, Fabric Manager ------------------
    Signature(
        id="cuda.compat-not-supported", kind="cuda-error", layer="driver-parts",
        pattern=r"forward compatibility was attempted on non supported HW",
        meaning="a forward-compatibility libcuda (cuda-compat) was loaded on a GPU forward compatibility is not "
                "for (cudaErrorCompatNotSupportedOnDevice, 804): only data centre GPUs support it",
        read_next="which libcuda.so.1 the process resolves (LD_LIBRARY_PATH, a compat directory) and the GPUs' "
                  "product names",
        confirm=("gpu.driver-parts", "gpu.runtime"), fields=(("number", "804"),),
        sources=("CUDA Runtime API cudaError_t: 804 cudaErrorCompatNotSupportedOnDevice (\"forward compatibility "
                 "was attempted on non supported HW\")",
                 "NVIDIA CUDA Compatibility guide, Forward Compatibility (data centre GPUs only)")),
    Signature(
        id="cuda.system-not-ready", kind="cuda-error", layer="driver-parts",
        pattern=r"\bsystem not yet initialized\b",
        meaning="CUDA's system is not ready (cudaErrorSystemNotReady, 802): on NVSwitch systems Fabric Manager "
                "is not running or is another release than the driver",
        read_next="the nvidia-fabricmanager unit's state and log, and its release against the kernel module's",
        confirm=("gpu.driver-parts", "gpu.runtime"), fields=(("number", "802"),),
        sources=("CUDA Runtime API cudaError_t: 802 cudaErrorSystemNotReady (\"system not yet initialized\")",)),
    Signature(
        id="cuda.system-driver-mismatch", kind="cuda-error", layer="driver-parts",
        pattern=r"system has unsupported display driver / cuda driver combination",
        meaning="the libcuda.so.1 loaded is another release than the kernel module (cudaErrorSystemDriverMismatch, "
                "803): a driver upgraded under a running module, or another libcuda first on the search path",
        read_next="the kernel module's release against libcuda.so.1's and the package record",
        confirm=("gpu.driver-parts", "gpu.runtime"), fields=(("number", "803"),),
        sources=("CUDA Runtime API cudaError_t: 803 cudaErrorSystemDriverMismatch (\"system has unsupported "
                 "display driver / cuda driver combination\")",)),
    Signature(
        id="fabricmanager.version-mismatch", kind="fabric-manager-mismatch", layer="driver-parts",
        pattern=r"fabric manager NVIDIA GPU driver interface version (?P<fm>\d+(?:\.\d+)+) "
                r"(?:don't|doesn't|don’t|doesn’t) match with driver version (?P<driver>\d+(?:\.\d+)+)",
        meaning="Fabric Manager is another release than the driver and refuses to start: on an NVSwitch system "
                "every CUDA program then fails with error 802 (system not yet initialized)",
        read_next="the Fabric Manager package's release against the kernel module's",
        confirm=("gpu.driver-parts",),
        sources=("NVIDIA Fabric Manager nv-fabricmanager (its log on a release mismatch; quoted in "
                 "NVIDIA/gpu-operator#544 and NVIDIA/gpu-driver-container#735)",)),
    Signature(
        id="cuda.no-kernel-image", kind="cuda-arch", layer="cuda",
        pattern=r"no kernel image is available for execution on the device",
        meaning="the code was not built for this GPU's compute capability (TORCH_CUDA_ARCH_LIST, or a torch "
                "wheel that dropped the architecture)",
        read_next="the GPU's compute capability and the arch list the ops and torch were built for",
        confirm=("gpu.capability.arch-list",),
        sources=("CUDA Runtime API cudaError_t: 209 cudaErrorNoKernelImageForDevice",)),
    Signature(
        id="cuda.oom", kind="cuda-oom", layer="gpu-memory",
        pattern=r"CUDA out of memory\. Tried to allocate (?P<size>[\d.]+ [KMGT]iB)",
        meaning="the GPU ran out of memory: the model's GPU share (ZeRO stage, offload settings, micro batch, "
                "activation checkpointing) does not fit",
        read_next="the ds_config's offload and batch settings, and what else holds GPU memory",
        sources=("PyTorch c10/cuda/CUDACachingAllocator.cpp (\"CUDA out of memory. Tried to allocate\")",)),
    Signature(
        id="cuda.bf16-unsupported", kind="bf16-unsupported", layer="gpu-capability",
        pattern=r"(?:Current CUDA Device does not support bfloat16|bf16 is not supported on)",
        meaning="bf16 was asked of a GPU older than compute capability 8.0",
        read_next="the GPUs' compute capability and the ds_config's bf16 section",
        confirm=("gpu.capability.precision",),
        sources=("PyTorch torch/amp/autocast_mode.py (\"Current CUDA Device does not support bfloat16\")",
                 "DeepSpeed runtime/engine.py _do_sanity_check (\"Type bf16 is not supported on your device.\")")),
    Signature(
        id="deepspeed.fp16-unsupported", kind="fp16-unsupported", layer="gpu-capability",
        pattern=r"Type fp16 is not supported on your device",
        meaning="DeepSpeed's CUDA accelerator refuses fp16 below compute capability 7.0 (6.x passes only with "
                "DS_ALLOW_DEPRECATED_FP16=1 in releases that have that switch)",
        read_next="the GPUs' compute capability and the ds_config's fp16 section",
        confirm=("gpu.capability.precision",),
        sources=("DeepSpeed runtime/engine.py _do_sanity_check (\"Type fp16 is not supported on your device.\")",
                 "DeepSpeed accelerator/cuda_accelerator.py is_fp16_supported")),
    Signature(
        id="cuda.error", kind="cuda-error", layer="cuda",
        pattern=r"CUDA error: (?P<name>[^\n]+?)\.?$",
        meaning="a CUDA call failed; kernel errors are reported asynchronously, so the line that raised may not "
                "be the one that failed (CUDA_LAUNCH_BLOCKING=1 makes it so)",
        read_next="the kernel log (Xid records) and the GPUs' health",
        confirm=("gpu.runtime",),
        sources=("PyTorch c10/cuda/CUDAException.h (C10_CUDA_CHECK: \"CUDA error: %s\")",)),
    Signature(
        id="nvcc.unsupported-arch", kind="nvcc-arch", layer="build",
        pattern=r"nvcc fatal\s*: Unsupported gpu architecture '(?P<arch>compute_\d+\w*)'",
        meaning="the arch list asks nvcc for an architecture this nvcc release no longer (or not yet) builds",
        read_next="TORCH_CUDA_ARCH_LIST against `nvcc --list-gpu-arch`",
        confirm=("gpu.capability.arch-list",),
        sources=("NVIDIA nvcc (\"nvcc fatal : Unsupported gpu architecture\")",
                 "seen from nvcc 13.0 (V13.0.88) given -gencode=arch=compute_60,code=sm_60")),
    Signature(
        id="ninja.log-version", kind="ninja-log-version", layer="jit-build-log",
        pattern=r"ninja: warning: build log version (?:is too (?P<age>old|new)|invalid, perhaps due to being too old)"
                r"; starting over",
        meaning="the op dir's .ninja_log was written by a ninja of another release series: this ninja deletes it "
                "and rebuilds every object of the op (minutes), and the other ninja will do the same",
        read_next="which ninja each shell of the launch resolves, and the log format each writes",
        confirm=("jit.build-log",),
        sources=("ninja src/build_log.cc (BuildLog::Load) at v1.12.0 - v1.13.2: \"build log version is too old; "
                 "starting over\" / \"build log version is too new; starting over\"",
                 "ninja src/build_log.cc at v1.10.0 - v1.11.1: \"build log version invalid, perhaps due to being "
                 "too old; starting over\"")),
    Signature(
        id="triton.no-libcuda", kind="libcuda-lookup", layer="cuda-lookup",
        pattern=r"libcuda\.so cannot found!",
        meaning="triton's libcuda lookup failed: no `ldconfig -p` line names the driver library (the driver's "
                "directory is not in the ld cache, or the cache is stale), or the file it then requires is not "
                "beside it (triton 2.x requires the unversioned libcuda.so, 3.x libcuda.so.1)",
        read_next="libcuda.so and libcuda.so.1 in ld.so.cache, where the driver libraries are, and the lookup "
                  "the installed triton does",
        confirm=("cuda.lookup",),
        sources=("triton third_party/nvidia/backend/driver.py and python/triton/common/build.py (libcuda_dirs: "
                 "\"libcuda.so cannot found!\")",)),
    Signature(
        id="nvml.version-mismatch", kind="driver-mismatch", layer="driver",
        pattern=r"Failed to initialize NVML: Driver/library version mismatch",
        meaning="the loaded nvidia kernel module is another version than the user-space driver libraries: the "
                "driver was upgraded and the module not reloaded (reboot, or unload and reload it)",
        read_next="/proc/driver/nvidia/version against libnvidia-ml.so's version",
        confirm=("gpu.driver",),
        sources=("NVML nvmlInit: NVML_ERROR_LIB_RM_VERSION_MISMATCH (nvidia-smi prints it)",)),
    Signature(
        id="kernel.api-mismatch", kind="driver-mismatch", layer="driver",
        pattern=r"NVRM: API mismatch: the client has the version (?P<client>\d+(?:\.\d+)+), but\s+this kernel "
                r"module has the version (?P<module>\d+(?:\.\d+)+)",
        meaning="the user-space driver and the loaded kernel module differ in version",
        read_next="the installed driver package and the module's version; reboot or reload the module",
        confirm=("gpu.driver", "kernel.api-mismatch"),
        sources=("NVIDIA kernel module nv.c (\"NVRM: API mismatch: the client has the version\")",)),
    Signature(
        id="kernel.xid", kind="xid", layer="kernel",
        pattern=r"NVRM: Xid \((?P<bus>(?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F:.]+)\): (?P<xid>\d+),",
        meaning="the NVIDIA driver reported an Xid event for the GPU at that bus address (79: fell off the bus; "
                "48/63/64/94/95: memory errors; 13/31/43: application faults; 119/120: GSP errors)",
        read_next="the kernel log around it, the GPU's ECC and retired pages, and the PCIe AER records",
        confirm=("kernel.xid",),
        sources=("NVIDIA Xid Errors (docs.nvidia.com/deploy/xid-errors)",)),
    Signature(
        id="kernel.oom-memcg", kind="oom-kill", layer="memory",
        pattern=r"oom-kill:constraint=(?P<constraint>CONSTRAINT_\w+)",
        meaning="the kernel's OOM killer ran; CONSTRAINT_MEMCG means a memory cgroup's limit was hit (a "
                "container or job limit), not the host's RAM",
        read_next="the cgroup's memory.max / memory.events and the host's free memory",
        confirm=("offload.host-ram", "kernel.oom"),
        sources=("Linux mm/oom_kill.c (dump_oom_summary: \"oom-kill:constraint=%s\")",)),
    Signature(
        id="kernel.memcg-oom", kind="oom-kill", layer="memory",
        pattern=r"Memory cgroup out of memory: Killed process (?P<pid>\d+)",
        meaning="a memory cgroup's limit was hit and the kernel killed a process in it",
        read_next="the cgroup's memory limit against what the job needs",
        confirm=("offload.host-ram", "kernel.oom"), fields=(("constraint", "CONSTRAINT_MEMCG"),),
        sources=("Linux mm/oom_kill.c (__oom_kill_process: \"Memory cgroup out of memory\")",)),
    Signature(
        id="kernel.oom", kind="oom-kill", layer="memory",
        pattern=r"Out of memory: Killed process (?P<pid>\d+)",
        meaning="the host ran out of memory and the kernel killed a process",
        read_next="the host's RAM and swap against the offload's pinned and swap buffers",
        confirm=("offload.host-ram", "kernel.oom"), fields=(("constraint", "CONSTRAINT_NONE"),),
        sources=("Linux mm/oom_kill.c (__oom_kill_process: \"Out of memory: Killed process\")",)),
    # -- NCCL and the network -----------------------------------------------------------------------
    Signature(
        id="nccl.no-socket-interface", kind="nccl-interface", layer="nccl-network",
        pattern=r"NCCL WARN (?:Bootstrap : no socket interface found|NET/Socket : No usable listening "
                r"interface found|NET/Socket : no interface found)",
        meaning="no interface matches NCCL_SOCKET_IFNAME (or none has an address): NCCL has nowhere to listen",
        read_next="the interfaces and addresses against NCCL_SOCKET_IFNAME's prefix / ^ / = rules",
        confirm=("nccl.socket",),
        sources=("NCCL src/misc/socket.cc and src/bootstrap.cc (the WARN lines)",
                 "NCCL src/transport/net_socket.cc (ncclNetSocketInit: \"NET/Socket : no interface found\")")),
    Signature(
        id="nccl.ib-completion", kind="nccl-ib", layer="nccl-network",
        pattern=r"NET/IB ?: Got completion (?:from peer (?P<peer>\S+) )?with (?:status=|error )(?P<status>\d+)",
        meaning="an InfiniBand/RoCE work request failed (status 12: transport retry exceeded, often a wrong GID "
                "index or an unreachable peer)",
        read_next="the port's link layer, state and GID table against NCCL_IB_GID_INDEX and NCCL_IB_HCA",
        confirm=("nccl.ib",),
        sources=("NCCL src/transport/net_ib.cc (\"NET/IB : Got completion from peer\")",)),
    Signature(
        id="nccl.watchdog-timeout", kind="collective-timeout", layer="ranks",
        pattern=r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
                r"OpType=(?P<op>\w+)",
        meaning="a collective did not finish in time: one rank is not taking part (it waits elsewhere, died, "
                "or the network between ranks is broken)",
        read_next="each rank's stack: which collective each one waits in",
        confirm=("ranks.waits",),
        sources=("PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (watchdog)",)),
    # -- NCCL's network: sockets and routes ---------------------------------------------------------
    Signature(
        id="nccl.no-subnet-interface", kind="nccl-interface", layer="nccl-network",
        pattern=r"NCCL WARN Net : No interface found in the same subnet as remote address (?P<address>[^<\s]+)",
        meaning="NCCL_SOCKET_IFNAME is unset and no interface of this node is in the subnet of NCCL_COMM_ID's "
                "address, so NCCL's default order found nothing to use",
        read_next="this node's interfaces and addresses against NCCL_COMM_ID and NCCL_SOCKET_IFNAME",
        confirm=("nccl.socket",),
        sources=("NCCL src/misc/socket.cc (ncclFindInterfaceMatchSubnet: \"Net : No interface found in the "
                 "same subnet as remote address %s\")",)),
    Signature(
        id="nccl.connect-failed", kind="nccl-connect", layer="nccl-network",
        pattern=r"NCCL WARN (?:\w+: )?(?:Net : )?Connect to (?P<address>\[?[0-9A-Fa-f:.]+\]?)<(?P<port>\d+)> "
                r"failed ?: (?P<error>[^\n]+)",
        meaning="a rank could not open a socket to another rank's address: the interface NCCL uses does not "
                "route to it (No route to host, a timeout), or nothing listens there (Connection refused)",
        read_next="which local interface routes to that address (ip route get) against the interface NCCL uses",
        confirm=("nccl.peers",),
        sources=("NCCL src/misc/socket.cc (ncclSocketConnect / socketStartConnect: \"Connect to %s failed : "
                 "%s\")",)),
    Signature(
        id="c10d.collective-mismatch", kind="collective-mismatch", layer="ranks",
        pattern=r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running collective: "
                r"CollectiveFingerPrint\(SequenceNumber=(?P<seq>\d+),? ?OpType=(?P<op>\w+)[^\n]{0,2000}?but Rank "
                r"(?P<other_rank>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+,? ?"
                r"OpType=(?P<other_op>\w+)",
        meaning="with TORCH_DISTRIBUTED_DEBUG=DETAIL torch compared the ranks' collectives before running one, "
                "and two ranks called different ones (or with different shapes): the job would have hung there",
        read_next="the code each rank ran before it: a branch on the rank, a generate() without synced_gpus "
                  "under ZeRO-3, a data loader that gives ranks different numbers of batches",
        sources=("PyTorch torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp (\"Detected mismatch between "
                 "collectives on ranks\")",)),
    # -- the C++ runtime ending the process ---------------------------------------------------------
    Signature(
        id="cxx.terminate-no-exception", kind="cxx-terminate", layer="process",
        pattern=r"terminate called without an active exception",
        meaning="std::terminate ran with no C++ exception in flight, and the process aborted (SIGABRT, exit "
                "status 134): most often a std::thread destroyed while still joinable. In a PyTorch job whose "
                "work had finished, the usual source is a process group (gloo or NCCL) still alive at "
                "interpreter exit, whose worker threads outlive the interpreter's teardown",
        read_next="where the output stopped: after the job's last line (call "
                  "torch.distributed.destroy_process_group() at the end on every rank) or mid-run (a native "
                  "library's thread: run it under gdb or with a core dump for the stack that called terminate)",
        sources=(VTERMINATE + "\"terminate called without an active exception\")",
                 "pytorch/pytorch#190489 (a gloo process group not destroyed before exit)",
                 "pytorch/pytorch#28126 (a process group agent's joinable thread)")),
    Signature(
        id="cxx.terminate-uncaught", kind="cxx-terminate", layer="process",
        pattern=r"terminate called after throwing an instance of '(?P<type>[^']+)'",
        meaning="a C++ exception of the named type escaped every handler (or was thrown on a native thread), "
                "and the process aborted (SIGABRT, exit status 134); the \"what():\" line after it is the "
                "exception's own message",
        read_next="the what(): line that follows: it names the failure (std::bad_alloc: memory ran out; "
                  "c10::Error or gloo::EnforceNotMet: the library's own check and where it failed)",
        sources=(VTERMINATE + "\"terminate called after throwing an instance of '%s'\", then "
                 "\"  what():  %s\")",)),
    # -- locked memory for RDMA (before NCCL's generic WARN line) ----------------------------------------
    Signature(
        id="nccl.ibv-reg-mr-enomem", kind="memlock", layer="nccl-network",
        pattern=r"Call to (?P<call>ibv_reg_mr\w*) failed with error Cannot allocate memory",
        meaning="NCCL could not register a buffer with the InfiniBand/RoCE device: the pages a registration "
                "pins count against the process's locked-memory limit (ulimit -l), and a low limit ends it with "
                "ENOMEM long before memory runs out",
        read_next="ulimit -l where the ranks start (the launching shell, through ssh for pdsh and mpirun, a "
                  "running rank's /proc/PID/limits) and the container's --ulimit memlock",
        confirm=("nccl.memlock",),
        sources=("NCCL src/misc/ibvwrap.cc (wrap_ibv_reg_mr: \"Call to ibv_reg_mr failed with error %s\")",
                 "Linux drivers/infiniband/core/umem.c (ib_umem_get: -ENOMEM above RLIMIT_MEMLOCK)")),
    Signature(
        id="rdma.ibv-reg-mr-enomem", kind="memlock", layer="nccl-network",
        pattern=r"ibv_reg_mr\b[^\n]{0,300}?(?:Cannot allocate memory|ENOMEM)",
        meaning="a memory registration with the RDMA device failed with ENOMEM: the pages it pins count against "
                "the process's locked-memory limit (ulimit -l)",
        read_next="ulimit -l where the ranks start (the launching shell, through ssh, a running rank's "
                  "/proc/PID/limits)",
        confirm=("nccl.memlock",),
        sources=("UCX src/uct/ib/base/ib_md.c (\"ibv_reg_mr(address=%p, length=%zu, access=0x%x) failed: %m\")",
                 "Open MPI opal/mca/btl/openib (\"ibv_reg_mr ... Cannot allocate memory\")")),
    Signature(
        id="libibverbs.rlimit-memlock", kind="memlock", layer="nccl-network",
        pattern=r"libibverbs: Warning: RLIMIT_MEMLOCK is (?P<bytes>\d+) bytes",
        meaning="libibverbs warns at start that the process's locked-memory limit is low: memory registrations "
                "will fail with ENOMEM once they pin more than it",
        read_next="ulimit -l where the ranks start, and the limits.d / systemd / container settings that set it",
        confirm=("nccl.memlock",),
        sources=("rdma-core libibverbs/init.c (check_memlock_limit: \"libibverbs: Warning: RLIMIT_MEMLOCK is "
                 "%llu bytes.\")",)),
    Signature(
        id="nccl.warn", kind="nccl-warn", layer="nccl",
        pattern=r"NCCL WARN (?P<text>.+)",
        meaning="NCCL reported a problem; the text names the part (NET/Socket, NET/IB, Cuda failure, Bootstrap)",
        read_next="NCCL_DEBUG=INFO output of the run: the transport and interface NCCL chose",
        sources=("NCCL src/include/debug.h (WARN lines)",)),
    Signature(
        id="ssh.resolve", kind="host-unresolved", layer="launcher",
        pattern=r"ssh: Could not resolve hostname (?P<host>[^:\s]+)",
        meaning="a host of the hostfile does not resolve on the launching node",
        read_next="getent hosts for every host of the hostfile",
        confirm=("launcher.hostfile",),
        sources=("OpenSSH ssh.c (\"Could not resolve hostname %s: %s\")",)),
    # -- the launch -----------------------------------------------------------------------------------
    Signature(
        id="deepspeed.rank-exit", kind="launcher-exit", layer="launcher",
        pattern=r"\] exits with return code = (?P<code>-?\d+)",
        meaning="DeepSpeed's per-node launcher reports that a rank it started exited with an error; the rank's own "
                "error above it is the cause",
        read_next="the first error the rank printed before this line",
        wraps=(ANY_ERROR,),
        sources=("DeepSpeed deepspeed/launcher/launch.py (sigkill_handler: \"{cmd} exits with return code = {rc}\")",)),
    Signature(
        id="launcher.called-process-error", kind="launcher-exit", layer="launcher",
        pattern=r"subprocess\.CalledProcessError: Command [^\n]{0,4000}? returned non-zero exit status (?P<code>\d+)",
        meaning="a launcher (DeepSpeed's launch.py in older releases, accelerate) raised because the training "
                "process it started failed; the training process's own error above it is the cause",
        read_next="the first error the training process printed before the launcher's traceback",
        wraps=(ANY_ERROR,),
        sources=("DeepSpeed deepspeed/launcher/launch.py before 0.10 (sigkill_handler raises "
                 "subprocess.CalledProcessError)", "accelerate src/accelerate/commands/launch.py (simple_launcher)")),
    Signature(
        id="torchrun.child-failed", kind="launcher-exit", layer="launcher",
        pattern=r"torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError",
        meaning="torchrun (torch.distributed.elastic) reports that a rank failed; its error table names the rank, "
                "and the rank's own traceback above it is the cause",
        read_next="the rank's error above torchrun's table (the failures section names its rank and exit code)",
        wraps=(ANY_ERROR,),
        sources=("PyTorch torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError)",)),
    Signature(
        id="deepspeed.ssh-unreachable", kind="host-unreachable", layer="launcher",
        pattern=r"Using hostfile at (?P<hostfile>\S+) but host=(?P<host>\S+) was not reachable via ssh",
        meaning="the DeepSpeed launcher's ssh check of the hostfile's first host failed: the name does not "
                "resolve, no sshd answers, or the login needs a password or an unaccepted host key",
        read_next="getent hosts HOST and ssh -o BatchMode=yes HOST true as the training user",
        confirm=("launcher.hostfile",),
        sources=("DeepSpeed deepspeed/launcher/runner.py (main: the passwordless-ssh check)",)),
    Signature(
        id="c10d.port-in-use", kind="port-in-use", layer="launcher",
        pattern=r"The server socket has failed to listen on any local network address\. port: (?P<port>\d+), "
                r"useIpv6: \w+, code: -98, name: EADDRINUSE",
        meaning="rank 0 could not bind the rendezvous port (MASTER_PORT / --master_port): another socket on this "
                "node already listens on it (a second launcher, or an earlier run's rank 0 still alive)",
        read_next="which process listens on that port on the node of rank 0 (ss -ltnp 'sport = :PORT')",
        confirm=("launcher.port",),
        sources=("PyTorch torch/csrc/distributed/c10d/socket.cpp (SocketListenOp: \"The server socket has failed "
                 "to listen on any local network address. port: {}, useIpv6: {}, code: {}, name: {}, message: {}\")",)),
    Signature(
        id="c10d.port-in-use-bind", kind="port-in-use", layer="launcher",
        pattern=r"The server socket has failed to bind to \[?[0-9A-Fa-f:.]*\]?:(?P<port>\d+) \(errno: 98 - "
                r"Address already in use\)",
        meaning="rank 0 could not bind the rendezvous port (MASTER_PORT / --master_port): another socket on this "
                "node already listens on it (a second launcher, or an earlier run's rank 0 still alive)",
        read_next="which process listens on that port on the node of rank 0 (ss -ltnp 'sport = :PORT')",
        confirm=("launcher.port",),
        sources=("PyTorch torch/csrc/distributed/c10d/socket.cpp before 2.2 (SocketListenOp::tryListen: \"The "
                 "server socket has failed to bind to {} (errno: {} - {}).\")",)),
    Signature(
        id="ssh.connect", kind="ssh-connect", layer="launcher",
        pattern=r"ssh: connect to host (?P<host>\S+) port (?P<port>\d+): (?P<error>Connection refused|Connection "
                r"timed out|No route to host|Network is unreachable|Connection reset by peer)",
        meaning="ssh (the launcher's, pdsh's or mpirun's) could not open a TCP connection to a host's ssh port: "
                "nothing listens there (refused), the packets are dropped or the host is down (timed out), or "
                "there is no route",
        read_next="a TCP connect from the launching node to each host's ssh port, and whether sshd runs there",
        confirm=("launcher.peers",),
        sources=("OpenSSH sshconnect.c (ssh_connect_direct: \"ssh: connect to host %s port %s: %s\")",)),
    Signature(
        id="c10d.client-connect", kind="rendezvous-connect", layer="launcher",
        pattern=r"The client socket has (?:timed out after \S+ while trying to connect to|failed to connect to any "
                r"network address of) \((?P<host>[^,\s()]+), (?P<port>\d+)\)",
        meaning="a rank could not reach rank 0's rendezvous store at MASTER_ADDR:MASTER_PORT within its timeout: "
                "rank 0 is not running or listens elsewhere, or the packets do not get through",
        read_next="rank 0's own output, and a TCP connect from this node to MASTER_ADDR:MASTER_PORT",
        confirm=("launcher.peers",),
        sources=("PyTorch torch/csrc/distributed/c10d/socket.cpp (SocketConnectOp: \"The client socket has "
                 "timed out after {} while trying to connect to ({}, {}).\")",)),
    Signature(
        id="deepspeed.launcher-missing", kind="launcher-missing", layer="launcher",
        pattern=r"launcher '(?P<launcher>\w+)' not installed\.",
        meaning="the DeepSpeed launcher starts the other hosts' ranks through a multi-node backend (pdsh unless "
                "--launcher names another) and did not find its program on the launching shell's PATH (pdsh; "
                "ompi_info for openmpi; mpirun for mpich and impi; sinfo for slurm)",
        read_next="which of pdsh, ompi_info, mpirun the launching shell finds (command -v), and the hostfile's "
                  "host count",
        confirm=("launcher.tools",),
        sources=("DeepSpeed deepspeed/launcher/runner.py (main: \"launcher '{args.launcher}' not installed.\"); "
                 "multinode_runner.py (backend_exists: shutil.which)",)),
    Signature(
        id="ssh.permission-denied", kind="ssh-auth", layer="launcher",
        pattern=r"(?:(?<![\w.-])(?P<user>[\w.-]{1,64})@(?P<host>[\w.:-]{1,255}): )?Permission denied "
                r"\((?P<methods>[a-z,-]{1,200})\)",
        meaning="ssh reached the host's sshd, but the login was refused: none of the user's keys is in the "
                "account's authorized_keys there (publickey), or the server asks for a password a launcher "
                "cannot type",
        read_next="ssh -v -o BatchMode=yes HOST true as the training user: the keys it offers",
        confirm=("launcher.hostfile",),
        sources=("OpenSSH sshconnect2.c (ssh_userauth2: \"%s@%s: Permission denied (%s).\")",)),
    Signature(
        id="ssh.host-key-changed", kind="ssh-hostkey", layer="launcher",
        pattern=r"WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!|Host key for (?P<host>\S+) has changed and you "
                r"have requested strict checking",
        meaning="the host's ssh key differs from the one the user's known_hosts holds for it (the host was "
                "reinstalled, or another machine answers at its address): ssh refuses to log in",
        read_next="the known_hosts line ssh names (Offending key in FILE:LINE), and why the host's key changed",
        confirm=("launcher.hostfile",),
        sources=("OpenSSH sshconnect.c (warn_changed_key: \"WARNING: REMOTE HOST IDENTIFICATION HAS "
                 "CHANGED!\"; check_host_key: \"Host key for %s has changed and you have requested strict "
                 "checking.\")",)),
    Signature(
        id="ssh.host-key-verification", kind="ssh-hostkey", layer="launcher",
        pattern=r"Host key verification failed\.",
        meaning="ssh did not accept the host's key: it is not in the user's known_hosts and there is no terminal "
                "to ask (or it changed: see the warning above it)",
        read_next="ssh -o BatchMode=yes HOST true as the training user, and the user's known_hosts",
        confirm=("launcher.hostfile",),
        sources=("OpenSSH sshconnect.c (check_host_key: \"Host key verification failed.\")",)),
    Signature(
        id="deepspeed.num-with-include", kind="launcher-options", layer="launcher",
        pattern=r"Cannot specify num_nodes/gpus with include/exclude",
        meaning="the deepspeed command line chooses GPUs twice: --num_gpus/--num_nodes and --include/--exclude",
        read_next="the launch command's resource options",
        confirm=("launcher.devices",),
        sources=("DeepSpeed deepspeed/launcher/runner.py (main)",)),
    # -- processes and resources --------------------------------------------------------------------
    Signature(
        id="resource.too-many-open-files", kind="nofile", layer="limits",
        pattern=r"\[Errno 24\] Too many open files",
        meaning="the process reached its open-files limit (ulimit -n): data loaders and NCCL open many",
        read_next="the training shell's ulimit -n and the service manager's LimitNOFILE",
        confirm=("gpu.limits",),
        sources=("Linux errno EMFILE (24), as Python's OSError prints it",)),
    Signature(
        id="resource.shm-denied", kind="shm-denied", layer="limits",
        pattern=r"(?:shm_open\b[^\n]{0,200}?failed|unable to open shared memory object <[^>\n]{0,300}> in read-write "
                r"mode)[^\n]{0,200}?Permission denied",
        meaning="a shared-memory object in /dev/shm could not be opened: /dev/shm is not writable by the training "
                "user (its mode is not 1777, or it is mounted read-only), or an object of that name left by another "
                "user's run is in the way",
        read_next="/dev/shm's mode, owner and mount options as the training user sees them",
        confirm=("gpu.shm-access",),
        sources=("PyTorch aten/src/ATen/MapAllocator.cpp (\"unable to open shared memory object <%s> in read-write "
                 "mode: %s (%d)\")", "POSIX shm_open(3): EACCES, \"Permission denied\"")),
    Signature(
        id="resource.shm-bus-error", kind="shm", layer="limits",
        pattern=r"(?:Unexpected bus error encountered in worker|insufficient shared memory \(shm\))",
        meaning="DataLoader workers ran out of /dev/shm (a container's default 64 MiB)",
        read_next="/dev/shm's size and the container's --shm-size / --ipc=host",
        confirm=("gpu.limits",),
        sources=("PyTorch torch/utils/data/_utils/signal_handling.py (bus error handler)",)),
    Signature(
        id="process.killed", kind="killed", layer="process", pattern=r"^(?:[\w/.-]+: line \d+: +\d+ )?Killed\b",
        meaning="the process was killed with SIGKILL: the kernel's OOM killer (host RAM or a memory cgroup's "
                "limit) or a scheduler enforcing a limit", fields=(("signal", "9"),),
        read_next="the kernel log's OOM records and the job's cgroup memory limit",
        confirm=("offload.host-ram",),
        sources=("bash jobs.c (the 'Killed' status line of a job ended by SIGKILL)",)),
    # -- the container and its cgroup limits --------------------------------------------------------
    Signature(
        id="kernel.memcg-task-limit", kind="oom-kill", layer="container",
        pattern=r"Task in (?P<memcg>\S+) killed as a result of limit of (?P<limit_memcg>\S+)",
        meaning="a memory cgroup's limit was hit and the kernel killed a task in it (the wording of kernels "
                "before 4.19): the job's or the container's limit, not the host's RAM",
        read_next="the job's cgroup: memory.limit_in_bytes / memory.max and its OOM-kill counter",
        confirm=("offload.host-ram", "container"), fields=(("constraint", "CONSTRAINT_MEMCG"),),
        sources=("Linux mm/memcontrol.c before 4.19 (mem_cgroup_print_oom_info: \"Task in \" ... "
                 "\" killed as a result of limit of \")",)),
    Signature(
        id="container.oomkilled", kind="oom-kill", layer="container",
        pattern=r"\bOOMKilled\b(?:\W{0,3}(?:true|True)\b)?",
        meaning="the container runtime reports the container was killed by its memory limit (docker inspect's "
                "State.OOMKilled, Kubernetes' container status reason OOMKilled)",
        read_next="the container's memory limit (docker run --memory, resources.limits.memory) against the job's "
                  "need",
        confirm=("container",), fields=(("constraint", "CONSTRAINT_MEMCG"),),
        sources=("moby api/types/container ContainerState.OOMKilled (docker inspect .State.OOMKilled)",
                 "Kubernetes pkg/kubelet: container status reason \"OOMKilled\"")),
    Signature(
        id="container.exit-137", kind="killed", layer="container",
        pattern=r"exited with code 137\b",
        meaning="a container's main process ended by SIGKILL (137 = 128 + 9): most often its memory cgroup's "
                "OOM killer", fields=(("signal", "9"),),
        read_next="docker inspect's State.OOMKilled and the container's memory limit",
        confirm=("container", "offload.host-ram"),
        sources=("docker compose (the \"<service> exited with code %d\" line of its log printer)",
                 "the shell's 128 + signal exit status for a process ended by a signal")),
    Signature(
        id="slurm.oom-kill-events", kind="slurm-oom", layer="container",
        pattern=r"Detected (?P<count>\d+) oom[-_]kill event(?:s|\(s\))? in (?:step |StepId=)(?P<step>\d+(?:\.\w+)?)"
                r"(?: cgroup)?\.(?:\s|$)",
        meaning="Slurm's step daemon counted OOM kills in the job step's memory cgroup: a task outgrew the job's "
                "memory request (--mem, --mem-per-cpu or --mem-per-gpu), which is the cgroup's limit, while the node "
                "may have had memory free",
        read_next="the job's request against its peak: sacct -j JOBID -o JobID,ReqMem,MaxRSS,State and "
                  "scontrol show job JOBID",
        confirm=("container.slurm-memory",),
        sources=("Slurm src/plugins/task/cgroup/task_cgroup_memory.c (task_cgroup_memory_check_oom: \"Detected "
                 "%\"PRIu64\" oom-kill event(s) in %ps cgroup. Some of your processes may have been killed by the "
                 "cgroup out-of-memory handler.\"; from 22.05 \"Detected %\"PRIu64\" oom_kill event%s in %ps. Some "
                 "of the step tasks have been OOM Killed.\")",)),
    Signature(
        id="slurm.task-out-of-memory", kind="slurm-oom", layer="container",
        pattern=r"\bsrun: error: (?P<hosts>[^\s:]{1,256}): tasks? (?P<tasks>[\d,\[\]-]{1,256}): Out Of Memory\b",
        meaning="srun reports a task ended by the job step's memory cgroup limit (SIG_OOM): the job's --mem / "
                "--mem-per-cpu was smaller than what the task took",
        read_next="the job's request against its peak: sacct -j JOBID -o JobID,ReqMem,MaxRSS,State",
        confirm=("container.slurm-memory",),
        sources=("Slurm src/plugins/launch/slurm/launch_slurm.c (_task_finish: \"%s: %s %s: Out Of Memory\" for a "
                 "return code of SIG_OOM)",)),
    Signature(
        id="offload.swap-buffer-size", kind="nvme-swap-buffers", layer="offload",
        pattern=r"More elements (?P<numel>\d+) than buffer size (?P<buffer_size>\d+)",
        meaning="DeepSpeed's NVMe parameter swapper met a parameter partition larger than one swap buffer: "
                "zero_optimization.offload_param.buffer_size is smaller than the largest parameter over the ranks "
                "(a large embedding or LM head most often)",
        read_next="offload_param.buffer_size against the model's largest parameter divided by the number of ranks",
        confirm=("offload.swap-buffers",),
        sources=("DeepSpeed deepspeed/runtime/swap_tensor/partitioned_param_swapper.py (get_buffer: assert numel <= "
                 "self.elements_per_buffer, f\"More elements {numel} than buffer size {self.elements_per_buffer}\")",)),
    Signature(
        id="offload.swap-buffer-count", kind="nvme-swap-buffers", layer="offload",
        pattern=r"Not enough buffers (?P<available>\d+) for swapping (?P<wanted>\d+)",
        meaning="DeepSpeed's NVMe parameter swapper had fewer free swap buffers than the parameters one swap-in "
                "takes (a module's and those prefetch asked for): zero_optimization.offload_param.buffer_count is "
                "too small for the model and the prefetch settings",
        read_next="offload_param.buffer_count and stage3_prefetch_bucket_size against the parameters of the largest "
                  "module",
        confirm=("offload.swap-buffers",),
        sources=("DeepSpeed deepspeed/runtime/swap_tensor/partitioned_param_swapper.py (swap_in: assert "
                 "len(swap_in_paths) <= len(self.available_buffer_ids), f\"Not enough buffers "
                 "{len(self.available_buffer_ids)} for swapping {len(swap_in_paths)}\")",)),
    Signature(
        id="python.ancdata", kind="ancdata", layer="python",
        pattern=r"received (?P<items>\d+) items of ancdata",
        meaning="a process could not receive a file descriptor another passed it (DataLoader workers hand each "
                "tensor over as a descriptor under torch's default sharing strategy, file_descriptor): the "
                "receiver's open-files limit was reached, or the job holds more shared tensors than it allows",
        read_next="ulimit -n of the shell that starts the job, and torch.multiprocessing.get_sharing_strategy() in "
                  "the training code",
        confirm=("pyenv.fd-passing",),
        sources=("CPython Lib/multiprocessing/reduction.py (recvfds: RuntimeError('received %d items of ancdata'))",
                 "PyTorch torch/utils/data/dataloader.py (NOTE [ DataLoader on Linux and open files limit ])")),
    Signature(
        id="python.cant-start-thread", kind="thread-limit", layer="container",
        pattern=r"can't start new thread",
        meaning="a new thread could not be created (EAGAIN): the cgroup's pids.max or the user's RLIMIT_NPROC "
                "is reached, DataLoader workers and NCCL's threads count against it",
        read_next="the job's cgroup pids.max against pids.current, and ulimit -u",
        confirm=("container",),
        sources=("CPython Modules/_threadmodule.c (ThreadError \"can't start new thread\")",)),
    Signature(
        id="process.fork-eagain", kind="thread-limit", layer="container",
        pattern=r"fork: (?:retry: )?Resource temporarily unavailable",
        meaning="the shell could not fork (EAGAIN): the cgroup's pids.max or RLIMIT_NPROC is reached",
        read_next="the job's cgroup pids.max against pids.current, and ulimit -u",
        confirm=("container",),
        sources=("bash jobs.c (make_child: \"fork: retry: %s\" and sys_error \"fork\")",)),
    Signature(
        id="openmp.thread-creation", kind="thread-limit", layer="container",
        pattern=r"libgomp: Thread creation failed: (?P<error>.+)",
        meaning="OpenMP could not start its threads (EAGAIN when the cgroup's pids.max or RLIMIT_NPROC is "
                "reached)",
        read_next="the job's cgroup pids.max against pids.current; OMP_NUM_THREADS per rank",
        confirm=("container",),
        sources=("GCC libgomp/team.c (gomp_team_start: gomp_fatal \"Thread creation failed: %s\")",)),
    Signature(
        id="openblas.pthread-create", kind="thread-limit", layer="container",
        pattern=r"OpenBLAS blas_thread_init: pthread_create failed for thread (?P<thread>\d+) of (?P<of>\d+)",
        meaning="OpenBLAS could not start its threads (EAGAIN): the cgroup's pids.max or RLIMIT_NPROC is reached",
        read_next="the job's cgroup pids.max against pids.current; OPENBLAS_NUM_THREADS / OMP_NUM_THREADS",
        confirm=("container",),
        sources=("OpenBLAS driver/others/blas_server.c (blas_thread_init: \"pthread_create failed for thread "
                 "%ld of %d: %s\")",)),
    # -- the kernel log: PCIe AER -------------------------------------------------------------------
    Signature(
        id="kernel.aer-bus-error", kind="aer", layer="kernel-log",
        pattern=r"(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): PCIe Bus Error: "
                r"severity=(?P<severity>[^,]+),",
        meaning="the PCIe link of that device reported an error: Corrected ones the link fixed itself (a replay; "
                "many mean a marginal link), Uncorrected (Non-Fatal) lost a transaction, Fatal took the link down "
                "(a GPU then falls off the bus, Xid 79)",
        read_next="the kernel log's AER records for that device, and which GPU has that bus address",
        confirm=("kernel.aer",),
        sources=("Linux drivers/pci/pcie/aer.c (aer_print_error: \"PCIe Bus Error: severity=%s, type=%s, (%s)\")",)),
    Signature(
        id="kernel.aer-received", kind="aer", layer="kernel-log",
        pattern=r"AER: (?:Multiple )?(?P<severity>Corrected|Correctable|Uncorrected \((?:Non-)?Fatal\)|"
                r"Uncorrectable \((?:Non-)?Fatal\)) error (?:message )?received(?: from)?:? "
                r"(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])",
        meaning="a PCIe root port received an error report from the device at that address (AER)",
        read_next="the kernel log's AER records for that device, and which GPU has that bus address",
        confirm=("kernel.aer",),
        sources=("Linux drivers/pci/pcie/aer.c (aer_isr_one_error: \"%s%s error received: %04x:%02x:%02x.%d\"; "
                 "6.x aer_print_source: \"%s%s error message received from %s\")",)),
    # -- python-env: launcher bugs of specific DeepSpeed releases (rules: layers/python_env/dsbugs.py) ------------
    Signature(
        id="deepspeed.bug-user-args-resplit", kind="ds-launcher-bug", layer="python-env",
        pattern=r"ValueError: No closing quotation",
        fields=(("bug", "user-args-resplit"),),
        meaning="shlex could not split a line with an unpaired quote; from the deepspeed launcher it is the bug of "
                "releases 0.10.1 to 0.12.4, which join the training script's arguments and split them again "
                "(runner.py main), so an argument with an apostrophe or a quote stops the launch",
        read_next="the traceback's file (deepspeed/launcher/runner.py, main) and the script's arguments that hold a "
                  "quote character; the installed DeepSpeed release",
        confirm=("pyenv.deepspeed-launch-bug",),
        sources=("Python Lib/shlex.py (read_token: raise ValueError(\"No closing quotation\"))",
                 "DeepSpeed PR 4007, PR 4265, PR 4660 (the re-split) and PR 4824 (its removal, tag v0.12.5)")),
    Signature(
        id="deepspeed.bug-pdsh-ssh-port", kind="ds-launcher-bug", layer="python-env",
        pattern=r"KeyError: 'PDSH_SSH_ARGS_APPEND'",
        fields=(("bug", "pdsh-ssh-port-keyerror"),),
        meaning="the deepspeed launcher of releases 0.11.0 to 0.14.0 appends --ssh_port to PDSH_SSH_ARGS_APPEND "
                "without reading it as empty when it is not set: a multi-node pdsh launch with --ssh_port stops "
                "before pdsh runs",
        read_next="the installed DeepSpeed release and whether PDSH_SSH_ARGS_APPEND is set where the launcher starts",
        confirm=("pyenv.deepspeed-launch-bug",),
        sources=("DeepSpeed deepspeed/launcher/multinode_runner.py (PDSHRunner.get_cmd)",
                 "DeepSpeed PR 4373 (the bug, tag v0.11.0) and PR 5318 (the fix, tag v0.14.1)")),
    Signature(
        id="deepspeed.bug-openmpi-env-check", kind="ds-launcher-bug", layer="python-env",
        pattern=r"MPI environment variables are not set\. Ensure you are running the script with an MPI-compatible "
                r"launcher",
        fields=(("bug", "openmpi-env-check"),),
        meaning="the deepspeed launcher of releases 0.16.4 to 0.18.3 demands the OMPI_COMM_WORLD_* variables before "
                "it runs mpirun, which is what sets them: --launcher openmpi fails from any shell",
        read_next="the installed DeepSpeed release and the launch's --launcher",
        confirm=("pyenv.deepspeed-launch-bug",),
        sources=("DeepSpeed deepspeed/launcher/multinode_runner.py (OpenMPIRunner._setup_mpi_environment)",
                 "DeepSpeed PR 6979 (the check, tag v0.16.4), issue 7711 and PR 7751 (its removal, tag v0.18.4)")),
    Signature(
        id="deepspeed.bug-pdsh-export-unquoted", kind="ds-launcher-bug", layer="python-env",
        pattern=r"bash: -c: line \d{1,6}: syntax error near unexpected token `(?P<token>[^'`\n]{1,40})'",
        fields=(("bug", "pdsh-export-unquoted"),),
        meaning="a remote bash could not parse the command it was given; under DeepSpeed's pdsh launcher before "
                "0.15.2 (but for 0.5.10 to 0.6.1) it is an exported value with shell syntax in it "
                "('export NAME=64(x2); ...'), written unquoted into the command every node runs",
        read_next="the launcher's 'cmd = pdsh ...' line: the export NAME=VALUE parts and the 'cd DIR' before the "
                  "token; .deepspeed_env and the NCCL*/PYTHON* variables of the launching shell",
        confirm=("pyenv.deepspeed-launch-bug",),
        sources=("GNU bash parse.y (report_syntax_error: \"syntax error near unexpected token `%s'\")",
                 "DeepSpeed deepspeed/launcher/multinode_runner.py (MultiNodeRunner.add_export, PDSHRunner.get_cmd)",
                 "DeepSpeed PR 5878 (the values quoted, tag v0.15.2)")),
)

BY_ID = {s.id: s for s in SIGNATURES}


def signature(sid: str | None) -> Signature | None:
    """The signature called ``sid``, or None."""
    return BY_ID.get(sid) if sid else None
