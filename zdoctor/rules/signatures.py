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

    @property
    def regex(self) -> re.Pattern[str]:
        return _compiled(self.pattern)


_CACHE: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    found = _CACHE.get(pattern)
    if found is None:
        found = _CACHE[pattern] = re.compile(pattern)
    return found


GLIBC_SOURCE = "glibc elf/dl-version.c (match_symbol: \"version `%s' not found (required by %s)\")"

SIGNATURES: tuple[Signature, ...] = (
    # -- the loader ---------------------------------------------------------------------------------
    Signature(
        id="loader.glibcxx-version", kind="version-not-found", layer="loader",
        pattern=r"(?P<library>[^\s:'\"]*libstdc\+\+\.so[.\d]*): version `(?P<version>(?:GLIBCXX|CXXABI)_[\d.]+)' "
                r"not found \(required by (?P<object>[^)\s]+)\)",
        meaning="the libstdc++ the process loaded is older than the one the named object was built against: "
                "an older copy earlier on the search path (LD_LIBRARY_PATH, an RPATH, a conda prefix) won",
        read_next="which libstdc++ the process really loaded (LD_DEBUG=libs), and every copy on the node",
        confirm=("libs.glibcxx", "libs.live"), sources=(GLIBC_SOURCE,)),
    Signature(
        id="loader.glibc-version", kind="version-not-found", layer="loader",
        pattern=r"(?P<library>[^\s:'\"]*libc\.so\.6|[^\s:'\"]*libm\.so\.6|[^\s:'\"]*libpthread\.so\.0): "
                r"version `(?P<version>GLIBC_[\d.]+)' not found \(required by (?P<object>[^)\s]+)\)",
        meaning="the named object was built against a newer glibc than this host has; only a build for an older "
                "glibc (or a newer OS) helps, not another libstdc++",
        read_next="the host's glibc version and which package owns the object that needs the newer one",
        confirm=("libs.glibc",), sources=(GLIBC_SOURCE,)),
    Signature(
        id="loader.version-not-found", kind="version-not-found", layer="loader",
        pattern=r"(?P<library>[^\s:'\"]+): version `(?P<version>[^']+)' not found \(required by (?P<object>[^)\s]+)\)",
        meaning="the library the loader found lacks a symbol version the named object needs",
        read_next="which copy of the library the loader picked, and which copies exist",
        confirm=("libs.live",), sources=(GLIBC_SOURCE,)),
    Signature(
        id="loader.undefined-symbol", kind="undefined-symbol", layer="loader",
        pattern=r"(?P<object>/[^\s:]+\.so[.\d]*): undefined symbol: (?P<symbol>[A-Za-z_$][\w$.@]*)",
        meaning="an extension refers to a symbol none of the libraries loaded before it define: built against "
                "another torch (or C++11 ABI), or a library it needs was shadowed or never linked",
        read_next="the symbol demangled, which library should define it, and the ABI flag of torch",
        confirm=("libs.symbols",),
        sources=("glibc elf/dl-lookup.c (_dl_lookup_symbol_x: \"undefined symbol: %s\")",)),
    Signature(
        id="loader.cannot-open", kind="library-not-found", layer="loader",
        pattern=r"(?P<library>[\w.+-]+\.so[.\d]*): cannot open shared object file: No such file or directory",
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
        id="build.extension-failed", kind="build-failed", layer="build",
        pattern=r"RuntimeError: Error building extension '(?P<op>[\w.-]+)'",
        meaning="the JIT build of a DeepSpeed op failed; the real cause is in the compiler lines above it",
        read_next="the first 'error:' line of the build output (zdoctor reads it as a symptom of its own), and the "
                  "op's build directory",
        sources=("PyTorch torch/utils/cpp_extension.py (_run_ninja_build: \"Error building extension '{}'\")",)),
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
        pattern=r"(?P<text>(?:train_batch_size|Micro batch size per gpu|Gradient accumulation steps)[^\n]*"
                r"(?:not equal|has to be greater than 0|must be))",
        meaning="the ds_config's batch sizes do not satisfy train_batch_size = micro_batch_per_gpu x "
                "gradient_accumulation_steps x world_size",
        read_next="the three batch settings and the world size the launch gives",
        sources=("DeepSpeed deepspeed/runtime/config.py (_batch_assertion)",)),
    # -- CUDA and the driver ------------------------------------------------------------------------
    Signature(
        id="cuda.init-error", kind="cuda-error", layer="cuda",
        pattern=r"(?:cudaGetDeviceCount\(\)|CUDA)[^\n]*?Error (?P<number>\d+): (?P<name>[^\n(]+?)"
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
    Signature(
        id="cuda.no-kernel-image", kind="cuda-arch", layer="cuda",
        pattern=r"no kernel image is available for execution on the device",
        meaning="the code was not built for this GPU's compute capability (TORCH_CUDA_ARCH_LIST, or a torch "
                "wheel that dropped the architecture)",
        read_next="the GPU's compute capability and the arch list the ops and torch were built for",
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
        sources=("PyTorch torch/amp/autocast_mode.py (\"Current CUDA Device does not support bfloat16\")",)),
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
        sources=("NVIDIA nvcc (\"nvcc fatal : Unsupported gpu architecture\")",)),
    Signature(
        id="triton.no-libcuda", kind="libcuda-lookup", layer="cuda-lookup",
        pattern=r"libcuda\.so cannot found!",
        meaning="triton looks up libcuda.so (unversioned) in `ldconfig -p` and found none: the driver library "
                "lives in a directory not in the ld cache, or only libcuda.so.1 is there",
        read_next="libcuda.so and libcuda.so.1 in ld.so.cache, and where the driver libraries are",
        sources=("triton python/triton/backends/nvidia/driver.py (libcuda_dirs: \"libcuda.so cannot found!\")",)),
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
        pattern=r"NVRM: API mismatch: the client has the version (?P<client>[\d.]+), but\s+this kernel module "
                r"has the version (?P<module>[\d.]+)",
        meaning="the user-space driver and the loaded kernel module differ in version",
        read_next="the installed driver package and the module's version; reboot or reload the module",
        confirm=("gpu.driver",),
        sources=("NVIDIA kernel module nv.c (\"NVRM: API mismatch: the client has the version\")",)),
    Signature(
        id="kernel.xid", kind="xid", layer="kernel",
        pattern=r"NVRM: Xid \((?P<bus>PCI:[0-9a-fA-F:.]+)\): (?P<xid>\d+),",
        meaning="the NVIDIA driver reported an Xid event for the GPU at that bus address (79: fell off the bus; "
                "48/63/64/94/95: memory errors; 13/31/43: application faults; 119/120: GSP errors)",
        read_next="the kernel log around it, the GPU's ECC and retired pages, and the PCIe AER records",
        sources=("NVIDIA Xid Errors (docs.nvidia.com/deploy/xid-errors)",)),
    Signature(
        id="kernel.oom-memcg", kind="oom-kill", layer="memory",
        pattern=r"oom-kill:constraint=(?P<constraint>CONSTRAINT_\w+)",
        meaning="the kernel's OOM killer ran; CONSTRAINT_MEMCG means a memory cgroup's limit was hit (a "
                "container or job limit), not the host's RAM",
        read_next="the cgroup's memory.max / memory.events and the host's free memory",
        confirm=("offload.host-ram",),
        sources=("Linux mm/oom_kill.c (dump_oom_summary: \"oom-kill:constraint=%s\")",)),
    Signature(
        id="kernel.memcg-oom", kind="oom-kill", layer="memory",
        pattern=r"Memory cgroup out of memory: Killed process (?P<pid>\d+)",
        meaning="a memory cgroup's limit was hit and the kernel killed a process in it",
        read_next="the cgroup's memory limit against what the job needs",
        confirm=("offload.host-ram",), fields=(("constraint", "CONSTRAINT_MEMCG"),),
        sources=("Linux mm/oom_kill.c (__oom_kill_process: \"Memory cgroup out of memory\")",)),
    Signature(
        id="kernel.oom", kind="oom-kill", layer="memory",
        pattern=r"Out of memory: Killed process (?P<pid>\d+)",
        meaning="the host ran out of memory and the kernel killed a process",
        read_next="the host's RAM and swap against the offload's pinned and swap buffers",
        confirm=("offload.host-ram",), fields=(("constraint", "CONSTRAINT_NONE"),),
        sources=("Linux mm/oom_kill.c (__oom_kill_process: \"Out of memory: Killed process\")",)),
    # -- NCCL and the network -----------------------------------------------------------------------
    Signature(
        id="nccl.no-socket-interface", kind="nccl-interface", layer="nccl-network",
        pattern=r"NCCL WARN (?:Bootstrap : no socket interface found|NET/Socket : No usable listening "
                r"interface found)",
        meaning="no interface matches NCCL_SOCKET_IFNAME (or none has an address): NCCL has nowhere to listen",
        read_next="the interfaces and addresses against NCCL_SOCKET_IFNAME's prefix / ^ / = rules",
        sources=("NCCL src/misc/socket.cc and src/bootstrap.cc (the WARN lines)",)),
    Signature(
        id="nccl.ib-completion", kind="nccl-ib", layer="nccl-network",
        pattern=r"NET/IB ?: Got completion (?:from peer (?P<peer>\S+) )?with (?:status=|error )(?P<status>\d+)",
        meaning="an InfiniBand/RoCE work request failed (status 12: transport retry exceeded, often a wrong GID "
                "index or an unreachable peer)",
        read_next="the port's link layer, state and GID table against NCCL_IB_GID_INDEX and NCCL_IB_HCA",
        sources=("NCCL src/transport/net_ib.cc (\"NET/IB : Got completion from peer\")",)),
    Signature(
        id="nccl.watchdog-timeout", kind="collective-timeout", layer="ranks",
        pattern=r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
                r"OpType=(?P<op>\w+)",
        meaning="a collective did not finish in time: one rank is not taking part (it waits elsewhere, died, "
                "or the network between ranks is broken)",
        read_next="each rank's stack: which collective each one waits in",
        sources=("PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (watchdog)",)),
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
        id="deepspeed.ssh-unreachable", kind="host-unreachable", layer="launcher",
        pattern=r"Using hostfile at (?P<hostfile>\S+) but host=(?P<host>\S+) was not reachable via ssh",
        meaning="the DeepSpeed launcher's ssh check of the hostfile's first host failed: the name does not "
                "resolve, no sshd answers, or the login needs a password or an unaccepted host key",
        read_next="getent hosts HOST and ssh -o BatchMode=yes HOST true as the training user",
        confirm=("launcher.hostfile",),
        sources=("DeepSpeed deepspeed/launcher/runner.py (main: the passwordless-ssh check)",)),
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
)

BY_ID = {s.id: s for s in SIGNATURES}


def signature(sid: str | None) -> Signature | None:
    """The signature called ``sid``, or None."""
    return BY_ID.get(sid) if sid else None
