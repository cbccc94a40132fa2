"""The facts each probe returns, one typed record per probe (``XxxFacts``), with nested records for nested
objects.

Every key may be missing (a probe that was skipped writes ``skipped`` alone); ``Optional`` marks a value a
probe writes as null for "unknown". Probes declare their record (``@probe(..., facts=...)``), checks read it
through :meth:`zdoctor.core.registry.Facts.of`, and ``shape.json`` (the types recorded results are checked
against as they are read) is generated from these records (:func:`zdoctor.core.shape.shape_of`).

The bodies use ``typing.List``/``Dict``/``Optional``: Python 3.8 evaluates them when the shape is generated.
"""

from typing import Any, Dict, List, Optional, TypedDict, Union


class CapacityNvme(TypedDict, total=False):
    """Facts at ``capacity.nvme``: the NVMe offload's need against the disk's room."""

    path: Optional[str]
    need_lower_bound: int
    free: Optional[int]
    fits: Optional[bool]


class CapacityFacts(TypedDict, total=False):
    """Facts at ``capacity``: DeepSpeed's estimate of the offload's memory needs against this node."""

    chosen: Optional[Dict[str, str]]
    chosen_note: Optional[str]
    chosen_rows: List[int]
    chosen_table: Optional[str]
    deepspeed_text: Optional[str]
    gpu_short: Optional[bool]
    gpus_per_node: Optional[int]
    gpus_per_node_source: Optional[str]
    largest_layer: Optional[int]
    largest_layer_source: str
    machine: Dict[str, Any]
    memlock_source: Optional[str]
    missing: Dict[str, str]
    model: Any
    nodes: int
    nvme: Optional[CapacityNvme]
    offload_target: Any
    params: int
    params_source: str
    ram_short: Optional[bool]
    ram_tight: Optional[bool]
    skipped: str
    stage: Optional[int]
    zero2: List[Dict[str, Any]]
    zero3: List[Dict[str, Any]]


class ContainerCgroupMemoryLevels(TypedDict, total=False):
    """Facts at ``container.cgroup.memory.levels[]``."""

    cgroup: str
    dir: str
    high: Optional[Union[int, str]]
    inactive_file: Optional[int]
    limit: Optional[Union[int, str]]
    room: Optional[int]
    usage: Optional[Union[int, str]]


class ContainerCgroupMemory(TypedDict, total=False):
    """Facts at ``container.cgroup.memory``."""

    cgroup: str
    dir: str
    error: Optional[str]
    events_file: str
    failcnt: Optional[int]
    high: Optional[Union[int, str]]
    levels: List[ContainerCgroupMemoryLevels]
    limit: Optional[Union[int, str]]
    limit_cgroup: Optional[str]
    limit_file: str
    oom: Optional[int]
    oom_kill: Optional[int]
    peak: Optional[int]
    peak_file: str
    room: Optional[int]
    under_oom: Optional[int]
    usage: Optional[int]
    version: str


class ContainerCgroupPidsLevels(TypedDict, total=False):
    """Facts at ``container.cgroup.pids.levels[]``."""

    cgroup: str
    current: Optional[Union[int, str]]
    max: Optional[Union[int, str]]
    room: Optional[int]


class ContainerCgroupPids(TypedDict, total=False):
    """Facts at ``container.cgroup.pids``."""

    cgroup: str
    current: Optional[int]
    dir: str
    error: Optional[str]
    levels: List[ContainerCgroupPidsLevels]
    limit_cgroup: Optional[str]
    max: Optional[Union[int, str]]
    refused: Optional[int]
    version: str


class ContainerCgroup(TypedDict, total=False):
    """Facts at ``container.cgroup``."""

    error: Optional[str]
    memory: ContainerCgroupMemory
    paths: Optional[Dict[str, Any]]
    pid: Union[int, str]
    pids: ContainerCgroupPids


class ContainerContainerSigns(TypedDict, total=False):
    """Facts at ``container.container.signs[]``."""

    evidence: str
    present: Optional[bool]
    sign: str


class ContainerContainer(TypedDict, total=False):
    """Facts at ``container.container``."""

    clues: List[str]
    in_container: bool
    kind: Optional[str]
    signs: List[ContainerContainerSigns]


class ContainerHeadroom(TypedDict, total=False):
    """Facts at ``container.headroom``."""

    bytes: Optional[int]
    host_available: Optional[int]
    limit: Optional[int]
    limit_cgroup: Optional[str]
    limit_file: Optional[str]
    room: Optional[int]
    source: Optional[str]
    text: str


class ContainerFacts(TypedDict, total=False):
    """Facts at ``container``."""

    after_command: bool
    cgroup: ContainerCgroup
    container: ContainerContainer
    headroom: ContainerHeadroom
    pid: Union[int, str]
    skipped: str
    whose: str


class CudaStackCudaHome(TypedDict, total=False):
    """Facts at ``cuda_stack.cuda_home``."""

    exists: bool
    headers: bool
    nvcc: str
    path: str
    source: str


class CudaStackDistro(TypedDict, total=False):
    """Facts at ``cuda_stack.distro``."""

    id: str
    id_like: List[str]
    version_id: str


class CudaStackHostConfig(TypedDict, total=False):
    """Facts at ``cuda_stack.host_config``."""

    error: str
    error_line: Any
    gcc_max: Any
    gcc_min: Any
    path: Any


class CudaStackNvcc(TypedDict, total=False):
    """Facts at ``cuda_stack.nvcc``."""

    build: str
    error: Any
    exists: bool
    path: str
    release: str


class CudaStackToolkits(TypedDict, total=False):
    """Facts at ``cuda_stack.toolkits[]``."""

    headers: bool
    nvcc: str
    path: str
    realpath: str
    source: str
    version: str


class CudaStackVersionedCompilers(TypedDict, total=False):
    """Facts at ``cuda_stack.versioned_compilers[]``."""

    gcc: str
    gxx: str
    major: int


class CudaStackFacts(TypedDict, total=False):
    """Facts at ``cuda_stack``."""

    cuda_home: CudaStackCudaHome
    distro: CudaStackDistro
    env: Dict[str, str]
    host_config: CudaStackHostConfig
    nvcc: CudaStackNvcc
    nvcc_on_path: List[str]
    skipped: str
    toolkits: List[CudaStackToolkits]
    versioned_compilers: List[CudaStackVersionedCompilers]


#: Facts at ``cudalookup.cache``: the ld.so cache, and its 64-bit entries for each libcuda name.
CudalookupCache = TypedDict('CudalookupCache', {
    'entries': int,
    'error': Optional[str],
    'path': str,
    'libcuda.so.1': List[str],
    'libcuda.so': List[str],
}, total=False)


class CudalookupDriverFile(TypedDict, total=False):
    """Facts at ``cudalookup.driver_dirs[].files.*``: a libcuda name in a driver directory."""

    path: str
    exists: bool
    realpath: str
    link: Optional[str]


class CudalookupDriverDirs(TypedDict, total=False):
    """Facts at ``cudalookup.driver_dirs[]``."""

    dir: str
    files: Dict[str, CudalookupDriverFile]
    in_cache: bool
    on_ld_library_path: bool
    stubs: bool


class CudalookupExtensionsNeeds(TypedDict, total=False):
    """Facts at ``cudalookup.extensions[].needs[]``."""

    family: str
    found: bool
    is_cuda_major: bool
    major: int
    soname: str


class CudalookupExtensions(TypedDict, total=False):
    """Facts at ``cudalookup.extensions[]``."""

    kind: str
    name: str
    needs: List[CudalookupExtensionsNeeds]
    path: str


class CudalookupLdconfigLibcuda(TypedDict, total=False):
    """Facts at ``cudalookup.ldconfig.libcuda[]``."""

    kind: str
    line: str
    name: str
    path: str


class CudalookupLdconfig(TypedDict, total=False):
    """Facts at ``cudalookup.ldconfig``."""

    argv: List[str]
    entries: int
    error: Any
    libcuda: List[CudalookupLdconfigLibcuda]
    ran: bool


class CudalookupLinkSearched(TypedDict, total=False):
    """Facts at ``cudalookup.link.searched[]``."""

    dev: bool
    dir: str
    so1: bool


class CudalookupLink(TypedDict, total=False):
    """Facts at ``cudalookup.link``."""

    cc: Optional[str]
    dirs: List[str]
    error: Any
    finds: Any
    searched: List[CudalookupLinkSearched]
    triton_dirs: List[Any]


class CudalookupLoader(TypedDict, total=False):
    """Facts at ``cudalookup.loader`` and ``cudalookup.loader_dev``."""

    error: Optional[str]
    label: str
    path: Optional[str]
    realpath: Optional[str]
    stub: bool
    tried: List[List[str]]
    via: Optional[str]


class CudalookupTorch(TypedDict, total=False):
    """Facts at ``cudalookup.torch``."""

    cuda: Optional[str]
    installed: bool
    major: Optional[int]
    version: str


class CudalookupTriton(TypedDict, total=False):
    """Facts at ``cudalookup.triton``."""

    installed: bool
    location: Any
    version: Any


class CudalookupFacts(TypedDict, total=False):
    """Facts at ``cudalookup``."""

    cache: CudalookupCache
    driver_dirs: List[CudalookupDriverDirs]
    env: Dict[str, Optional[str]]
    extensions: List[CudalookupExtensions]
    ld_so_conf_d: List[str]
    ldconfig: CudalookupLdconfig
    libs_ran: bool
    link: CudalookupLink
    loader: CudalookupLoader
    loader_dev: CudalookupLoader
    plans: Dict[str, Any]
    skipped: str
    toolkit_stubs: List[Any]
    torch: CudalookupTorch
    triton: CudalookupTriton
    wheels: Dict[str, Any]


class DsconfigFacts(TypedDict, total=False):
    """Facts at ``dsconfig``: the job's DeepSpeed config as DeepSpeed reads it."""

    bytes: Optional[int]
    deepspeed: Dict[str, Any]
    devices: Dict[str, Any]
    error: Optional[str]
    file: Any
    hidden_size: Any
    json_error: Optional[str]
    lints: List[Dict[str, Any]]
    memlock: Dict[str, Any]
    nvme_paths: List[Dict[str, Any]]
    offload_target: Dict[str, Any]
    path: str
    paths: Dict[str, Any]
    precision: Any
    settings: Dict[str, Any]
    skipped: str
    stage: Any
    syntax: Optional[str]
    text: str
    uses_auto: bool
    valid: bool
    wall_clock_breakdown: Optional[bool]


class DsreleaseFacts(TypedDict, total=False):
    """Facts at ``dsrelease``."""

    bugs: Dict[str, Any]
    exports: Optional[List[Dict[str, Any]]]
    installed: bool
    jit_origins: List[Any]
    location: str
    python: Optional[str]
    rules: Dict[str, Any]
    skipped: str
    version: str


class GlibcFacts(TypedDict, total=False):
    """Facts at ``glibc``."""

    host: Optional[str]
    libs_read: int
    owners: Dict[str, Any]
    skipped: str
    torch_location: Optional[str]
    torch_needs: Optional[str]
    torch_needs_by: List[Any]
    wheel_tag_glibc: Optional[str]
    wheel_tags: List[Any]


class GpuEnvFacts(TypedDict, total=False):
    """Facts at ``gpu_env``."""

    gpus_per_node: Any
    nodes: Any
    skipped: str
    vars: Dict[str, str]


class GpucapGpus(TypedDict, total=False):
    """Facts at ``gpucap.gpus[]``."""

    cc: str
    index: int
    name: str


class GpucapNvcc(TypedDict, total=False):
    """Facts at ``gpucap.nvcc``."""

    archs: List[str]
    error: str
    path: str
    ran: bool


class GpucapOps(TypedDict, total=False):
    """Facts at ``gpucap.ops[]``."""

    cuda: bool
    dir: str
    error: str
    name: str
    pairs: List[List[str]]
    so_pairs: List[List[str]]
    so_path: str


class GpucapPrebuilt(TypedDict, total=False):
    """Facts at ``gpucap.prebuilt[]``."""

    cuda: bool
    error: str
    name: str
    pairs: List[List[str]]
    path: str


class GpucapPrecisionEntry(TypedDict, total=False):
    """Facts at ``gpucap.precision.*``."""

    enabled: Union[List[Any], bool, int, Dict[str, Any], str]
    key: str
    where: str


class GpucapTorch(TypedDict, total=False):
    """Facts at ``gpucap.torch``."""

    bf16_emulation: bool
    build_pairs: List[List[str]]
    cuda: str
    imported: bool
    version: str


class GpucapFacts(TypedDict, total=False):
    """Facts at ``gpucap``."""

    allow_deprecated_fp16: bool
    env_arch_list: str
    fp16_rule: str
    gpus: List[GpucapGpus]
    gpus_why: str
    names_rule: str
    nvcc: GpucapNvcc
    ops: List[GpucapOps]
    prebuilt: List[GpucapPrebuilt]
    precision: Dict[str, GpucapPrecisionEntry]
    precision_why: str
    skipped: str
    torch: GpucapTorch


class GpusampleGpus(TypedDict, total=False):
    """Facts at ``gpusample.gpus[]``: one GPU's utilisation over the sample."""

    index: int
    name: Optional[str]
    util: Dict[str, Optional[float]]
    mem_util: Dict[str, Optional[float]]
    series: List[float]
    sparkline: str
    errors: List[str]


class GpusampleFacts(TypedDict, total=False):
    """Facts at ``gpusample``: every GPU's utilisation, sampled through NVML."""

    skipped: str
    seconds: float
    interval: float
    samples: int
    driver: Any
    gpus: List[GpusampleGpus]


class HostLimitsContainer(TypedDict, total=False):
    """Facts at ``host_limits.container``."""

    clues: List[str]
    in_container: bool
    kind: Optional[str]


class HostLimitsOwn(TypedDict, total=False):
    """Facts at ``host_limits.own``."""

    memlock_hard_kb: int
    memlock_soft_kb: int
    nofile_hard: int
    nofile_soft: int


class HostLimitsShm(TypedDict, total=False):
    """Facts at ``host_limits.shm``."""

    error: Any
    exists: bool
    free: int
    fstype: str
    options: str
    path: str
    total: int


class HostLimitsTarget(TypedDict, total=False):
    """Facts at ``host_limits.target``."""

    error: Any
    memlock_hard_kb: Optional[int]
    memlock_soft_kb: Union[int, str]
    nofile_hard: Optional[int]
    nofile_soft: int


class HostLimitsFacts(TypedDict, total=False):
    """Facts at ``host_limits``."""

    container: HostLimitsContainer
    gpus_per_node: Any
    limits_d: Dict[str, Any]
    nodes: Any
    own: HostLimitsOwn
    shm: HostLimitsShm
    skipped: str
    target: HostLimitsTarget


class HostfileNodes(TypedDict, total=False):
    """Facts at ``hostfile.nodes[]``."""

    line: int
    name: str
    slots: float


class HostfileResolve(TypedDict, total=False):
    """Facts at ``hostfile.resolve[]``."""

    addresses: List[str]
    error: Optional[str]
    host: str
    seconds: float


class HostfileSsh(TypedDict, total=False):
    """Facts at ``hostfile.ssh[]``."""

    argv: List[str]
    exit_code: int
    host: str
    ok: bool
    said: str


class HostfileFacts(TypedDict, total=False):
    """Facts at ``hostfile``."""

    error: Optional[str]
    nodes: List[HostfileNodes]
    path: str
    resolve: List[HostfileResolve]
    skipped: str
    source: str
    ssh: List[HostfileSsh]
    ssh_skipped: Optional[str]


class HostramDevices(TypedDict, total=False):
    """Facts at ``hostram.devices``."""

    offload_optimizer: str
    offload_param: str


class HostramFacts(TypedDict, total=False):
    """Facts at ``hostram``."""

    config: str
    devices: HostramDevices
    estimate_per_node: Any
    estimate_unknown: str
    exhausted: bool
    extra: List[Any]
    extra_known_per_node: int
    extra_per_node: int
    gpus_per_node: Any
    killed: List[Any]
    log: str
    log_error: Any
    mem_available: int
    mem_available_host: int
    mem_source: str
    mem_source_text: str
    mem_total: int
    mem_total_host: int
    oom_kills: List[Any]
    pinned_blocks: List[Any]
    skipped: str
    wsl: bool


class InfinibandDevicesPortsGids(TypedDict, total=False):
    """Facts at ``infiniband.devices[].ports[].gids[]``."""

    address: str
    empty: bool
    gid: str
    index: int
    link_local: bool
    ndev: Optional[str]
    type: str


class InfinibandDevicesPorts(TypedDict, total=False):
    """Facts at ``infiniband.devices[].ports[]``."""

    gid_table_size: int
    gids: List[InfinibandDevicesPortsGids]
    link_layer: str
    phys_state: str
    phys_state_code: int
    port: int
    rate: str
    state: str
    state_code: int


class InfinibandDevices(TypedDict, total=False):
    """Facts at ``infiniband.devices[]``."""

    name: str
    ports: List[InfinibandDevicesPorts]


class InfinibandFacts(TypedDict, total=False):
    """Facts at ``infiniband``."""

    devices: List[InfinibandDevices]
    error: Any
    present: bool
    root: str
    skipped: str


class JitbuildlogNinjas(TypedDict, total=False):
    """Facts at ``jitbuildlog.ninjas[]``."""

    error: str
    hash: str
    path: str
    role: str
    roles: List[str]
    runs: bool
    version: str
    writes: int


class JitbuildlogNow(TypedDict, total=False):
    """Facts at ``jitbuildlog.now``."""

    arch_pairs: List[List[str]]
    arch_source: str
    cxx: str
    cxx_how: str
    nvcc: str
    python_include: str
    torch_include: str


class JitbuildlogOpsDifferences(TypedDict, total=False):
    """Facts at ``jitbuildlog.ops[].differences[]``."""

    build: str
    now: str
    what: str


class JitbuildlogOpsVars(TypedDict, total=False):
    """Facts at ``jitbuildlog.ops[].vars``."""

    cxx: str
    nvcc: str


class JitbuildlogOps(TypedDict, total=False):
    """Facts at ``jitbuildlog.ops[]``."""

    arch_pairs: List[List[str]]
    differences: List[JitbuildlogOpsDifferences]
    dir: str
    error: str
    last_build_ms: int
    log_error: str
    log_lines: int
    log_version: float
    name: str
    outputs: float
    predictions: Dict[str, Any]
    vars: JitbuildlogOpsVars


class JitbuildlogFacts(TypedDict, total=False):
    """Facts at ``jitbuildlog``."""

    launch: str
    ninjas: List[JitbuildlogNinjas]
    now: JitbuildlogNow
    ops: List[JitbuildlogOps]
    python: str
    root: str
    skipped: str
    unread: List[str]


class JitcacheDeepspeed(TypedDict, total=False):
    """Facts at ``jitcache.deepspeed``."""

    installed: bool
    location: Optional[str]
    prebuilt_ops: List[Any]


class JitcacheRoots(TypedDict, total=False):
    """Facts at ``jitcache.roots[]``."""

    exists: bool
    mount: Any
    network: bool
    path: str
    tag: Any


class JitcacheFacts(TypedDict, total=False):
    """Facts at ``jitcache``."""

    abiflags: str
    base: str
    corrupt: List[Any]
    deepspeed: JitcacheDeepspeed
    env: Dict[str, str]
    expected_tag: Optional[str]
    locks: List[Any]
    ops: List[Any]
    python_version: str
    roots: List[JitcacheRoots]
    skipped: str
    source: str
    truncated: bool
    unscanned: List[Any]


class JitprereqCompileTrial(TypedDict, total=False):
    """Facts at ``jitprereq.compile.plain`` and ``jitprereq.compile.with_python_h``: one compile."""

    error: Any
    ok: bool
    stderr: str


class JitprereqCompileBackEnd(TypedDict, total=False):
    """Facts at ``jitprereq.compile.back_end``: where the driver looks for a pass it could not start."""

    driver: Optional[str]
    expected: Optional[str]
    found: Optional[str]
    machine: Optional[str]
    program: str
    searched: List[str]
    version: Optional[str]


class JitprereqCompile(TypedDict, total=False):
    """Facts at ``jitprereq.compile``."""

    back_end: JitprereqCompileBackEnd
    compiler: str
    error: Optional[str]
    no_space: Any
    plain: JitprereqCompileTrial
    with_python_h: JitprereqCompileTrial


class JitprereqNinja(TypedDict, total=False):
    """Facts at ``jitprereq.ninja``."""

    beside_interpreter: str
    noninteractive_path: str
    noninteractive_source: str
    on_noninteractive_path: str
    on_path: str
    runs: Dict[str, Any]


class JitprereqPythonHeaders(TypedDict, total=False):
    """Facts at ``jitprereq.python_headers``."""

    base_executable: str
    base_is_conda: bool
    base_prefix: str
    error: Any
    include: str
    prefix: str
    python_h: bool
    version: str


class JitprereqFacts(TypedDict, total=False):
    """Facts at ``jitprereq``."""

    compile: JitprereqCompile
    ninja: JitprereqNinja
    python: str
    python_headers: JitprereqPythonHeaders
    skipped: str


class KernelLogAer(TypedDict, total=False):
    """Facts at ``kernel_log.aer[]``."""

    bus: str
    bus_address: str
    driver: Optional[str]
    facility: int
    level: int
    port: Optional[str]
    seq: int
    severity: str
    severity_text: str
    text: str
    time: float
    type: Optional[str]
    usec: int


class KernelLogApiMismatch(TypedDict, total=False):
    """Facts at ``kernel_log.api_mismatch[]``."""

    client: str
    facility: int
    level: int
    module: str
    seq: int
    text: str
    time: float
    usec: int


class KernelLogAttempts(TypedDict, total=False):
    """Facts at ``kernel_log.attempts[]``."""

    error: str
    source: str


class KernelLogDevicesNow(TypedDict, total=False):
    """Facts at ``kernel_log.devices_now[]``."""

    address: str
    bus_address: str
    current_link_speed: Optional[str]
    current_link_width: Optional[str]
    error: str
    max_link_speed: Optional[str]
    max_link_width: Optional[str]
    path: str
    present: Optional[bool]
    vendor: Optional[str]


class KernelLogOoms(TypedDict, total=False):
    """Facts at ``kernel_log.ooms[]``."""

    constraint: str
    facility: int
    kind: str
    level: int
    limit_kb: int
    memcg: str
    pid: int
    seq: int
    task: str
    task_memcg: str
    text: str
    time: float
    usage_kb: int
    usec: int


class KernelLogWindow(TypedDict, total=False):
    """Facts at ``kernel_log.window``."""

    boot_time: float
    since: int
    since_given: bool
    until: int


class KernelLogXids(TypedDict, total=False):
    """Facts at ``kernel_log.xids[]``."""

    bus: str
    bus_address: str
    detail: str
    facility: int
    level: int
    name: str
    pid: Optional[int]
    seq: int
    text: str
    time: float
    usec: int
    xid: int


class KernelLogUserSpace(TypedDict, total=False):
    """Facts at ``kernel_log.user_space[]``: a record that reads like kernel evidence but is not the kernel's."""

    facility: Optional[int]
    kind: str
    level: Optional[int]
    seq: Optional[int]
    text: str
    time: Optional[float]
    usec: Optional[int]
    why: str


class KernelLogFacts(TypedDict, total=False):
    """Facts at ``kernel_log``."""

    aer: List[KernelLogAer]
    api_mismatch: List[KernelLogApiMismatch]
    attempts: List[KernelLogAttempts]
    boot: str
    devices_now: List[KernelLogDevicesNow]
    kernel_records_read: int
    ooms: List[KernelLogOoms]
    overwritten: int
    path: str
    records_read: int
    skipped: str
    source: Optional[str]
    truncated: Any
    user_space: List[KernelLogUserSpace]
    window: KernelLogWindow
    xids: List[KernelLogXids]


class LaunchDeepspeed(TypedDict, total=False):
    """Facts at ``launch.deepspeed``."""

    location: str
    version: str


class LaunchLaunch(TypedDict, total=False):
    """Facts at ``launch.launch``."""

    assigned: Dict[str, Any]
    binders: List[Any]
    command: str
    error: Any
    executable: str
    inner: Any
    launcher: str
    module: Any
    options: Dict[str, Any]
    program: List[str]
    script: str


class LaunchRankEnv(TypedDict, total=False):
    """Facts at ``launch.rank_env``."""

    falls_back_to_mpi: bool
    given: List[Any]
    launcher_sets: List[Any]
    missing: List[str]
    mpi: List[Any]
    slurm: List[Any]


class LaunchRulesEntry(TypedDict, total=False):
    """Facts at ``launch.rules.*``."""

    file: str
    how: str
    state: str


class LaunchScript(TypedDict, total=False):
    """Facts at ``launch.script``."""

    calls: List[str]
    path: str


class LaunchFacts(TypedDict, total=False):
    """Facts at ``launch``."""

    deepspeed: LaunchDeepspeed
    env: Dict[str, Any]
    launch: LaunchLaunch
    mpi4py: bool
    processes: List[Any]
    rank_env: LaunchRankEnv
    rules: Dict[str, LaunchRulesEntry]
    script: LaunchScript
    skipped: str
    source: str


class LibfixFacts(TypedDict, total=False):
    """Facts at ``libfix``."""

    argv: List[str]
    early_trials: Dict[str, Any]
    needed: bool
    plans: List[Any]
    skipped: str


class LibsInterpreter(TypedDict, total=False):
    """Facts at ``libs.interpreter``."""

    base_prefix: str
    path: str
    prefix: str
    rpath: Any
    rpath_copies: List[Any]
    rpath_dirs: List[Any]
    runpath: str
    runpath_dirs: List[str]


class LibsInventory(TypedDict, total=False):
    """Facts at ``libs.inventory[]``."""

    conda_prefix: Any
    cxxabi_max: str
    error: Any
    found_as: List[str]
    gcc_release: str
    gcc_series: str
    glibcxx_max: str
    has_every_need: bool
    path: str
    realpath: str
    versions: List[str]


class LibsLoaded(TypedDict, total=False):
    """Facts at ``libs.loaded[]``."""

    label: str
    path: str


class LibsLoader(TypedDict, total=False):
    """Facts at ``libs.loader``."""

    glibc: str
    hwcaps: List[str]
    system_dirs: List[str]


class LibsFacts(TypedDict, total=False):
    """Facts at ``libs``."""

    corrupt_jit_ops: List[Any]
    env: Dict[str, Any]
    errors: List[Any]
    etc_preload: List[Any]
    failures: List[Any]
    interpreter: LibsInterpreter
    inventory: List[LibsInventory]
    libstdcxx: Dict[str, Any]
    loaded: List[LibsLoaded]
    loader: LibsLoader
    needs: List[Any]
    skipped: str
    start_failures: List[Any]
    targets: List[Any]


class LivetraceLoadedAll(TypedDict, total=False):
    """Facts at ``livetrace.loaded_all[]``."""

    name: str
    path: str


class LivetraceSteps(TypedDict, total=False):
    """Facts at ``livetrace.steps[]``."""

    skipped: str
    step: str


class LivetraceFacts(TypedDict, total=False):
    """Facts at ``livetrace``."""

    argv: List[str]
    command: str
    compiling: List[Any]
    exit_code: int
    last_files: List[Any]
    libstdcxx: List[Any]
    loaded_all: List[LivetraceLoadedAll]
    needs: Dict[str, Any]
    notes: List[Any]
    ok: bool
    pending_calls: List[Any]
    pids: List[int]
    ranks: Any
    refused_locks: List[Any]
    skipped: str
    source: str
    stderr_tail: str
    steps: List[LivetraceSteps]
    strace_available: bool
    strace_lines: List[Any]
    strace_used: bool
    stuck_states: List[Any]
    timed_out: bool
    timeout: float
    version_errors: List[Any]


class LocktrialFacts(TypedDict, total=False):
    """Facts at ``locktrial``."""

    skipped: str
    trials: List[Any]


class NcclProviders(TypedDict, total=False):
    """Facts at ``nccl.providers[]``."""

    dist: Optional[str]
    kind: str
    loaded: bool
    path: str
    realpath: str
    size: int
    soname: str
    version: str
    version_source: str
    via: str


class NcclTorchRequires(TypedDict, total=False):
    """Facts at ``nccl.torch_requires``."""

    cuda_major: int
    dist: str
    version: str


class NcclWheels(TypedDict, total=False):
    """Facts at ``nccl.wheels[]``."""

    cuda_major: int
    dist: str
    dist_info: str
    record_size: int
    site: str
    version: str


class NcclFacts(TypedDict, total=False):
    """Facts at ``nccl``."""

    import_error_nccl: Any
    loaded: List[str]
    providers: List[NcclProviders]
    python: str
    sites: List[str]
    skipped: str
    torch_cuda: Optional[str]
    torch_nccl: Optional[str]
    torch_nccl_error: Any
    torch_nccl_source: Optional[str]
    torch_requires: NcclTorchRequires
    torch_version: Optional[str]
    wheels: List[NcclWheels]


class NcclLogInterface(TypedDict, total=False):
    """Facts at ``nccl_log.bootstrap``, ``nccl_log.ib_oob`` and ``nccl_log.socket[]``: an interface NCCL named."""

    address: str
    ifname: str


class NcclLogIb(TypedDict, total=False):
    """Facts at ``nccl_log.ib[]``."""

    device: str
    link_layer: str
    port: int


class NcclLogFacts(TypedDict, total=False):
    """Facts at ``nccl_log``."""

    bootstrap: Optional[NcclLogInterface]
    ib: List[NcclLogIb]
    ib_none: bool
    ib_oob: Optional[NcclLogInterface]
    ifname_env: Optional[str]
    network: Optional[str]
    seen: bool
    skipped: str
    socket: List[NcclLogInterface]
    sources: List[str]
    unread: List[str]
    warns: List[str]


class NcclNetChoiceChosen(TypedDict, total=False):
    """Facts at ``nccl_net.choice.chosen[]``."""

    address: str
    family: str
    ifname: str
    prefixlen: int


class NcclNetChoiceSpec(TypedDict, total=False):
    """Facts at ``nccl_net.choice.spec``."""

    entries: List[List[Union[int, str]]]
    exact: bool
    exclude: bool


class NcclNetChoice(TypedDict, total=False):
    """Facts at ``nccl_net.choice``."""

    chosen: List[NcclNetChoiceChosen]
    family: Any
    ignored: Any
    matched_without_address: List[Any]
    rule: str
    source: str
    spec: NcclNetChoiceSpec
    value: str


class NcclNetHostfile(TypedDict, total=False):
    """Facts at ``nccl_net.hostfile``."""

    error: Optional[str]
    hosts: List[str]
    path: str


class NcclNetInterfacesAddrs(TypedDict, total=False):
    """Facts at ``nccl_net.interfaces[].addrs[]``."""

    family: str
    local: str
    prefixlen: int
    scope: str


class NcclNetInterfaces(TypedDict, total=False):
    """Facts at ``nccl_net.interfaces[]``."""

    addrs: List[NcclNetInterfacesAddrs]
    bond_slaves: List[Any]
    bridge_ports: List[Any]
    carrier: Optional[str]
    flags: List[str]
    ifindex: int
    ifname: str
    kind: Any
    mac: str
    master: Any
    mtu: int
    operstate: str
    operstate_sysfs: str
    sysfs_master: Any


class NcclNetIp(TypedDict, total=False):
    """Facts at ``nccl_net.ip``."""

    error: Any
    path: str
    ran: bool


class NcclNetPeersRoute(TypedDict, total=False):
    """Facts at ``nccl_net.peers[].route``."""

    dev: str
    dst: str
    gateway: Optional[str]
    prefsrc: str
    type: Optional[str]


class NcclNetPeers(TypedDict, total=False):
    """Facts at ``nccl_net.peers[]``."""

    address: Optional[str]
    name: str
    resolve_error: Optional[str]
    route: Optional[NcclNetPeersRoute]
    route_error: Optional[str]
    source: str


class NcclNetRoutes(TypedDict, total=False):
    """Facts at ``nccl_net.routes[]``."""

    dev: str
    dst: str
    family: str
    gateway: Optional[str]
    metric: Optional[int]
    prefsrc: Optional[str]
    type: Any


class NcclNetRules(TypedDict, total=False):
    """Facts at ``nccl_net.rules``."""

    bootstrap_interfaces: int
    default_steps: List[str]
    exact_mark: str
    exclude_mark: str
    min_length: int
    port_mark: str
    separator: str
    socket_max_interfaces: int
    sources: List[str]


class NcclNetFacts(TypedDict, total=False):
    """Facts at ``nccl_net``."""

    choice: NcclNetChoice
    env: Dict[str, str]
    hostfile: NcclNetHostfile
    interfaces: List[NcclNetInterfaces]
    ip: NcclNetIp
    peers: List[NcclNetPeers]
    peers_total: int
    routes: List[NcclNetRoutes]
    rules: NcclNetRules
    skipped: str


class NvmeInventoryFacts(TypedDict, total=False):
    """Facts at ``nvme_inventory``."""

    drives: List[Any]
    skipped: str
    suggestion: Any
    unmounted: List[Any]


class NvmlGpusEcc(TypedDict, total=False):
    """Facts at ``nvml.gpus[].ecc``."""

    aggregate_corrected: int
    aggregate_uncorrected: int
    current: bool
    pending: bool
    remap_failure: bool
    remap_pending: bool
    volatile_corrected: int
    volatile_uncorrected: int


class NvmlGpusMemory(TypedDict, total=False):
    """Facts at ``nvml.gpus[].memory``."""

    free: int
    total: int
    used: int


class NvmlGpusPcie(TypedDict, total=False):
    """Facts at ``nvml.gpus[].pcie``."""

    gen: int
    gen_max: int
    width: int
    width_max: int


class NvmlGpusThrottle(TypedDict, total=False):
    """Facts at ``nvml.gpus[].throttle``."""

    reasons: List[str]


class NvmlGpusUtilization(TypedDict, total=False):
    """Facts at ``nvml.gpus[].utilization``."""

    gpu: int
    memory: int


class NvmlGpus(TypedDict, total=False):
    """Facts at ``nvml.gpus[]``."""

    compute_capability: str
    compute_mode: str
    ecc: NvmlGpusEcc
    errors: Dict[str, Any]
    index: int
    memory: NvmlGpusMemory
    mig: bool
    name: str
    not_supported: List[Any]
    pci_bus_id: str
    pcie: NvmlGpusPcie
    perf_state: str
    persistence: bool
    power_limit_w: float
    power_w: float
    processes: List[Any]
    temperature_c: int
    throttle: NvmlGpusThrottle
    utilization: NvmlGpusUtilization
    uuid: str


class NvmlLibrary(TypedDict, total=False):
    """Facts at ``nvml.library``."""

    available: bool
    error: Optional[str]
    error_kind: Optional[str]


class NvmlSmi(TypedDict, total=False):
    """Facts at ``nvml.smi``."""

    count: int
    cuda_version: str
    disagree: List[Any]
    driver: str
    error: Optional[str]
    path: Optional[str]
    ran: bool


class NvmlFacts(TypedDict, total=False):
    """Facts at ``nvml``."""

    available: bool
    count: Optional[int]
    cuda_driver: Optional[int]
    cuda_driver_version: Optional[str]
    driver: Optional[str]
    error: Optional[str]
    error_kind: Optional[str]
    errors: Dict[str, Any]
    gpus: List[NvmlGpus]
    library: NvmlLibrary
    nvml_version: Optional[str]
    sampled_s: float
    skipped: str
    smi: NvmlSmi
    source: Optional[str]


class OtherCachesCachesMount(TypedDict, total=False):
    """Facts at ``other_caches.caches[].mount``."""

    dev: str
    fstype: str
    options: str
    point: str
    source: str


class OtherCachesCaches(TypedDict, total=False):
    """Facts at ``other_caches.caches[]``."""

    exists: bool
    locks: List[Any]
    mount: OtherCachesCachesMount
    name: str
    network: bool
    path: str
    source: str


class OtherCachesFacts(TypedDict, total=False):
    """Facts at ``other_caches``."""

    caches: List[OtherCachesCaches]
    skipped: str


class P2pIommu(TypedDict, total=False):
    """Facts at ``p2p.iommu``."""

    cmdline: Dict[str, Any]
    gpus: Dict[str, Any]
    mode: str
    units: List[Any]


class P2pFacts(TypedDict, total=False):
    """Facts at ``p2p``."""

    acs: Dict[str, Any]
    between: Dict[str, Any]
    chains: Dict[str, Any]
    gpus: List[str]
    iommu: P2pIommu
    nvlinks: Dict[str, Any]
    nvml_pairs: Dict[str, Any]
    peer_copy: Any
    skipped: str


class ProcessesMappedLib(TypedDict, total=False):
    """Facts at ``processes.processes[].libgcc_s[]`` and ``processes.processes[].libstdcxx[]``: a mapped library."""

    deleted: bool
    dev: str
    inode: int
    path: str


class ProcessesProcesses(TypedDict, total=False):
    """Facts at ``processes.processes[]``."""

    children: List[int]
    cmdline: List[str]
    cpu_delta_s: float
    cpu_s: float
    cwd: str
    elapsed_s: float
    environ: Dict[str, str]
    errors: Dict[str, Any]
    libgcc_s: List[ProcessesMappedLib]
    libstdcxx: List[ProcessesMappedLib]
    matched: str
    name: str
    open_files: List[Any]
    open_files_truncated: bool
    pid: int
    ppid: int
    state: str
    state_letter: str
    username: str
    wchan: str


class ProcessesFacts(TypedDict, total=False):
    """Facts at ``processes``."""

    jitcache: str
    locks: List[Any]
    processes: List[ProcessesProcesses]
    sample_s: float
    scope: Dict[str, Any]
    self_pid: int
    skipped: str


class PyenvCandidates(TypedDict, total=False):
    """Facts at ``pyenv.candidates``."""

    active: List[Any]
    on_path: List[str]


class PyenvDeepspeed(TypedDict, total=False):
    """Facts at ``pyenv.deepspeed``."""

    dist: str
    installed: bool
    location: str
    origin: str
    prebuilt_ops: List[Any]
    version: str


class PyenvPackage(TypedDict, total=False):
    """Facts at ``pyenv.packages.*``: one distribution as the target interpreter sees it."""

    dist: Optional[str]
    installed: bool
    location: Optional[str]
    origin: Optional[str]
    version: Optional[str]


class PyenvPackages(TypedDict, total=False):
    """Facts at ``pyenv.packages``."""

    deepspeed: PyenvPackage
    mpi4py: Dict[str, Any]
    ninja: PyenvPackage
    numpy: PyenvPackage
    torch: PyenvPackage
    triton: PyenvPackage


class PyenvPythonConda(TypedDict, total=False):
    """Facts at ``pyenv.python.conda``."""

    base_prefix_is_conda: bool
    env_name: Any
    env_prefix: Any
    prefix_is_conda: bool


class PyenvPythonGlibc(TypedDict, total=False):
    """Facts at ``pyenv.python.glibc``."""

    confstr: str
    libc_ver: List[str]


class PyenvPython(TypedDict, total=False):
    """Facts at ``pyenv.python``."""

    base_prefix: str
    byteorder: str
    cache_tag: str
    conda: PyenvPythonConda
    errors: Dict[str, Any]
    exec_prefix: str
    executable: str
    glibc: PyenvPythonGlibc
    implementation: str
    in_venv: bool
    machine: str
    mapped_libs: List[str]
    maxsize_64bit: bool
    platform: str
    prefix: str
    realpath: str
    sys_path: List[str]
    sysconfig: Dict[str, Union[int, str]]
    t: float
    version: str
    version_info: List[int]


class PyenvTarget(TypedDict, total=False):
    """Facts at ``pyenv.target``."""

    explicit: bool
    realpath: str
    requested: str
    resolved: str


class PyenvTorchCudaCheckErrors(TypedDict, total=False):
    """Facts at ``pyenv.torch.cuda_check.errors``."""

    nccl: str


class PyenvTorchCudaCheck(TypedDict, total=False):
    """Facts at ``pyenv.torch.cuda_check``."""

    available: bool
    cudnn: Optional[int]
    device_count: Optional[int]
    errors: PyenvTorchCudaCheckErrors
    init_error: Any
    nccl: Optional[List[int]]
    state: str
    t: float


class PyenvTorchImport(TypedDict, total=False):
    """Facts at ``pyenv.torch.import``."""

    error: Optional[str]
    error_line: Optional[str]
    error_type: Optional[str]
    seconds: Optional[float]
    signal: Optional[str]
    state: str
    traceback: Optional[str]


#: Facts at ``pyenv.torch`` (``import`` is a keyword, so the functional form).
PyenvTorch = TypedDict('PyenvTorch', {
    'config': str,
    'cuda': Optional[str],
    'cuda_check': PyenvTorchCudaCheck,
    'cxx11_abi': bool,
    'dist_version': Optional[str],
    'file': str,
    'git_version': str,
    'hip': Optional[str],
    'import': PyenvTorchImport,
    'installed': bool,
    'libgcc_s': List[str],
    'libstdcxx': List[str],
    'location': Optional[str],
    'mapped_libs': List[str],
    'parallel_info': str,
    'sharing_strategy': Optional[str],
    'version': str,
}, total=False)


class PyenvFacts(TypedDict, total=False):
    """Facts at ``pyenv``."""

    bad_records: int
    candidates: PyenvCandidates
    complete: bool
    deepspeed: PyenvDeepspeed
    env: Dict[str, str]
    error: Any
    error_kind: Any
    exit_code: int
    hung_in: Any
    packages: PyenvPackages
    python: PyenvPython
    ran_as: Any
    signal: Any
    skipped: str
    node_load: Optional[str]
    stages: List[str]
    stuck_states: List[str]
    target: PyenvTarget
    timed_out: bool
    torch: PyenvTorch
    waiting: bool


class RankcoresBinding(TypedDict, total=False):
    """Facts at ``rankcores.binding``."""

    bind_core_list: Any
    bind_cores_to_rank: bool
    binders: List[Any]
    mpi: Any


class RankcoresCpus(TypedDict, total=False):
    """Facts at ``rankcores.cpus``."""

    count: int
    cpus: str
    error: Any
    pid: int
    threads: int


class RankcoresNumaNodes(TypedDict, total=False):
    """Facts at ``rankcores.numa.nodes[]``."""

    count: int
    cpus: str
    node: int


class RankcoresNuma(TypedDict, total=False):
    """Facts at ``rankcores.numa``."""

    error: Any
    nodes: List[RankcoresNumaNodes]


class RankcoresFacts(TypedDict, total=False):
    """Facts at ``rankcores``."""

    binding: RankcoresBinding
    cpus: RankcoresCpus
    cpus_of: str
    numa: RankcoresNuma
    numactl: Dict[str, Any]
    omp_how: str
    omp_num_threads: Any
    ranks: List[Any]
    ranks_how: str
    ranks_per_node: int
    skipped: str


class RanksProcesses(TypedDict, total=False):
    """Facts at ``ranks.processes[]``."""

    cmdline: List[str]
    launcher: Optional[str]
    name: str
    pid: int
    ppid: int
    python: bool


class RanksPyspy(TypedDict, total=False):
    """Facts at ``ranks.pyspy``."""

    error: str
    path: Optional[str]
    version: str


class RanksRanksPythonThreadsFrames(TypedDict, total=False):
    """Facts at ``ranks.ranks[].python.threads[].frames[]``."""

    file: str
    line: Optional[int]
    name: str
    path: str


class RanksRanksPythonThreads(TypedDict, total=False):
    """Facts at ``ranks.ranks[].python.threads[]``."""

    active: bool
    frames: List[RanksRanksPythonThreadsFrames]
    name: str
    owns_gil: bool
    tid: Optional[int]


class RanksRanksPython(TypedDict, total=False):
    """Facts at ``ranks.ranks[].python``."""

    error: str
    threads: List[RanksRanksPythonThreads]


class RanksRanksThreads(TypedDict, total=False):
    """Facts at ``ranks.ranks[].threads[]``."""

    comm: str
    state: str
    syscall: Optional[str]
    tid: int
    wchan: str


class RanksRanks(TypedDict, total=False):
    """Facts at ``ranks.ranks[]``."""

    comm: str
    cpu_delta_s: Optional[float]
    cpu_s: Optional[float]
    cpu_sample_s: float
    env: Optional[Dict[str, str]]
    env_readable: bool
    kernel_stack: Optional[List[str]]
    local_rank: str
    pid: int
    python: Optional[RanksRanksPython]
    rank: str
    state: str
    state_words: str
    syscall: Optional[str]
    tcp_peers: List[str]
    threads: List[RanksRanksThreads]
    wchan: str


class RanksFacts(TypedDict, total=False):
    """Facts at ``ranks``."""

    helpers: List[Any]
    how: str
    launcher: Optional[str]
    missing: Optional[str]
    named: int
    processes: List[RanksProcesses]
    pyspy: RanksPyspy
    ranks: List[RanksRanks]
    root: Optional[int]
    skipped: str
    source: str


class ShellinitFacts(TypedDict, total=False):
    """Facts at ``shellinit``."""

    errors: Dict[str, Any]
    files: List[str]
    home: str
    lines: List[Any]
    skipped: str
    sources: Dict[str, Any]


class ShmAccessFacts(TypedDict, total=False):
    """Facts at ``shm_access``."""

    error: Any
    euid: int
    exists: bool
    mode: str
    path: str
    skipped: Optional[str]
    sticky: bool
    tested_as: str
    uid: int
    user: str
    user_rule: str
    user_uid: int
    write_test: bool


class StdcxxLinksDirs(TypedDict, total=False):
    """Facts at ``stdcxx_links.dirs[]``."""

    dir: str
    link_n: int
    link_present: bool
    link_target: str
    newest: str
    newest_n: int
    why: str


class StdcxxLinksFacts(TypedDict, total=False):
    """Facts at ``stdcxx_links``."""

    dirs: List[StdcxxLinksDirs]
    skipped: str


class StorageUser(TypedDict, total=False):
    """Facts at ``storage.user``."""

    group: str
    name: str
    rule: str


class StorageFacts(TypedDict, total=False):
    """Facts at ``storage``."""

    access: Dict[str, Any]
    config_paths: List[Any]
    device: Dict[str, Any]
    device_error: Any
    ds_config_error: Any
    exists: bool
    explicit: bool
    filesystem: Dict[str, Any]
    fstab_path: str
    fstab_unmounted: List[Any]
    in_fstab: Any
    is_dir: bool
    libaio: Dict[str, Any]
    mount: Dict[str, Any]
    odirect: Dict[str, Any]
    path: str
    probed_path: str
    skipped: str
    source: str
    space: Dict[str, Any]
    throughput: Dict[str, Any]
    user: StorageUser


class SymbolsFacts(TypedDict, total=False):
    """Facts at ``symbols``."""

    errors: List[Any]
    loaded_count: float
    skipped: str
    torch_cxx11_abi: bool


class SystemFacts(TypedDict, total=False):
    """Facts at ``system``."""

    arch: str
    cpus: Optional[int]
    glibc: Optional[str]
    hostname: str
    kernel: str
    memory: Dict[str, int]
    os: str
    skipped: str


class ToolchainCompilers(TypedDict, total=False):
    """Facts at ``toolchain.compilers[]``."""

    also: List[str]
    family: str
    first_line: str
    major: int
    name: str
    path: str
    realpath: str
    toolset: Any
    vendor: str
    version: str
    wins: bool


class ToolchainCudaHost(TypedDict, total=False):
    """Facts at ``toolchain.cuda_host``."""

    command: str
    error: Any
    family: str
    first_line: str
    major: int
    path: str
    realpath: str
    source: str
    toolset: Any
    value: Optional[str]
    vendor: str
    version: str
    wrapper: Any


class ToolchainDistro(TypedDict, total=False):
    """Facts at ``toolchain.distro``."""

    id: str
    id_like: List[Any]
    version_id: str


class ToolchainJit(TypedDict, total=False):
    """Facts at ``toolchain.jit``."""

    command: str
    error: Any
    family: str
    first_line: str
    glibcxx_max: str
    major: int
    path: str
    realpath: str
    source: str
    toolset: Any
    value: Optional[str]
    vendor: str
    version: str
    wrapper: Any


class ToolchainSysconfigEntry(TypedDict, total=False):
    """Facts at ``toolchain.sysconfig.*``."""

    command: str
    error: Any
    family: str
    first_line: str
    major: int
    overridden_by: Any
    path: str
    realpath: str
    toolset: Any
    value: str
    vendor: str
    version: str
    wrapper: Any


class ToolchainToolsets(TypedDict, total=False):
    """Facts at ``toolchain.toolsets``."""

    compilers: List[Any]
    enabled: List[Any]
    installed: List[Any]
    on_path: List[Any]
    scl: Any
    scl_list: List[Any]


class ToolchainTorchBuild(TypedDict, total=False):
    """Facts at ``toolchain.torch_build``."""

    compiler: str
    cuda_runtime: Any
    cxx11_abi: bool
    cxx_compiler: str
    cxx_std: str
    major: int
    toolset: str
    torch_version: str
    version: str


#: Facts at ``toolchain.winners``: the compiler each name finds first.
ToolchainWinners = TypedDict('ToolchainWinners', {
    'c++': str,
    'cc': str,
    'g++': str,
    'gcc': str,
}, total=False)


class ToolchainFacts(TypedDict, total=False):
    """Facts at ``toolchain``."""

    compilers: List[ToolchainCompilers]
    cuda_host: ToolchainCudaHost
    deepspeed_installed: bool
    devtoolset_on_path: bool
    distro: ToolchainDistro
    env: Dict[str, Any]
    jit: ToolchainJit
    path: str
    pyenv_ok: bool
    skipped: str
    sysconfig: Dict[str, ToolchainSysconfigEntry]
    toolsets: ToolchainToolsets
    torch_build: Optional[ToolchainTorchBuild]
    torch_installed: bool
    torch_version: Optional[str]
    winners: ToolchainWinners


class TrainlogFacts(TypedDict, total=False):
    """Facts at ``trainlog``: the wall_clock_breakdown timings of the training log."""

    backward_parts: Dict[str, Any]
    disk_bound: bool
    dominant: Optional[str]
    error: Optional[str]
    format: str
    head_skipped: bool
    iteration_ms: float
    lines_read: int
    path: str
    phases: Dict[str, Dict[str, Any]]
    phases_missing: List[Any]
    rank: Any
    ranks: List[Any]
    read_bytes: int
    shares: Dict[str, float]
    size: int
    skipped: str
    skipped_bytes: int
    step_bound: bool
    swap: Dict[str, Any]
    timer_lines: int
    timer_names: str
    timers: Dict[str, Dict[str, Any]]
    zero_offload_flag: List[Any]


class DriverPartsFacts(TypedDict, total=False):
    """Facts at ``driver_parts``: the GPU driver's kernel module, libraries, packages and Fabric Manager."""

    boot_time: Optional[int]
    distro: Any
    fabric: Any
    history: Any
    libraries: Dict[str, Any]
    module: Dict[str, Any]
    mounted: Any
    packages: Any
    skipped: str


class DriverResumeSleep(TypedDict, total=False):
    """One suspend or resume record."""

    kind: Optional[str]
    time: Optional[float]
    text: str
    source: str


class DriverResumeUvm(TypedDict, total=False):
    """The nvidia_uvm module as /proc/modules and sysfs give it."""

    loaded: Optional[bool]
    use_count: Optional[int]
    users: List[str]
    refcnt: Optional[int]
    error: Optional[str]


class DriverResumeHolder(TypedDict, total=False):
    """A process holding /dev/nvidia-uvm open."""

    pid: int
    user: str
    command: str


class DriverResumeFacts(TypedDict, total=False):
    """Facts at ``driver_resume``: suspend/resume records of this boot, nvidia_uvm and who holds its device."""

    sleeps: List[DriverResumeSleep]
    sleep_errors: List[str]
    uvm: DriverResumeUvm
    device: str
    device_exists: bool
    holders: List[DriverResumeHolder]
    holders_partial: Optional[str]
    preserve_allocations: Optional[bool]
    services: Dict[str, Optional[str]]
    skipped: str


class KernelModulesNvidia(TypedDict, total=False):
    """An NVIDIA module file of one kernel's tree."""

    path: str
    version: Optional[str]
    vermagic: Optional[str]
    compressed: bool


class KernelModulesKernel(TypedDict, total=False):
    """One installed kernel's module tree."""

    release: str
    dir: str
    nvidia: List[KernelModulesNvidia]
    truncated: Optional[str]
    headers: bool


class KernelModulesDkmsEntry(TypedDict, total=False):
    """One line of ``dkms status``."""

    module: Optional[str]
    version: Optional[str]
    kernel: Optional[str]
    arch: Optional[str]
    state: Optional[str]
    line: Optional[str]


class KernelModulesDkms(TypedDict, total=False):
    """``dkms status``: whether it is installed, ran, and what it lists."""

    installed: bool
    path: Optional[str]
    exit_code: Optional[int]
    error: Optional[str]
    entries: List[KernelModulesDkmsEntry]


class KernelModulesFacts(TypedDict, total=False):
    """Facts at ``kernel_modules``: the NVIDIA module files of each installed kernel, and ``dkms status``."""

    root: str
    running: str
    kernels: List[KernelModulesKernel]
    kernels_error: Optional[str]
    running_tree: Optional[KernelModulesKernel]
    others_with_module: List[str]
    loaded: Optional[bool]
    dkms: KernelModulesDkms
    distro: Any
    skipped: str


class LimitfixFacts(TypedDict, total=False):
    """Facts at ``limitfix``: the failing command re-run with the open-files limit raised."""

    skipped: str
    limit: int
    exit_code: Optional[int]
    error: Optional[str]
    fixed: bool
    still_emfile: bool


class SpecialFilesFound(TypedDict, total=False):
    """Facts at ``special_files.found[]``: a FIFO, device or looping link where files are read."""

    path: str
    kind: str
    where: str


class SpecialFilesFacts(TypedDict, total=False):
    """Facts at ``special_files``: the special files where libraries, ops and start-up files are read."""

    skipped: str
    found: List[SpecialFilesFound]
    looked: List[str]
    truncated: bool


class SymptomRecord(TypedDict, total=False):
    """Facts at ``symptoms.symptoms[]``: one symptom, as :meth:`zdoctor.core.symptom.Symptom.to_dict` writes it."""

    id: str
    source: str
    text: str
    kind: str
    fields: Dict[str, str]
    signature: Optional[str]
    where: str


class SymptomsGiven(TypedDict, total=False):
    """Facts at ``symptoms.given``: which of the user's inputs were given."""

    command: bool
    log: bool
    symptom: bool


class SymptomsFacts(TypedDict, total=False):
    """Facts at ``symptoms``: what the user saw, with where each was seen, and what could not be read."""

    skipped: str
    symptoms: List[SymptomRecord]
    unread: List[str]
    sources: List[str]
    given: SymptomsGiven


class RendezvousFacts(TypedDict, total=False):
    """Facts at ``rendezvous``: who listens on the job's rendezvous port(s) on this node."""

    free_port: Optional[int]
    job_pids: List[int]
    launcher: Optional[str]
    ports: List[Dict[str, Any]]
    skipped: str
    slurm: bool


class PeersFacts(TypedDict, total=False):
    """Facts at ``peers``: TCP from this node to the job's hosts and its rendezvous address, and this node's name."""

    hosts: List[Dict[str, Any]]
    master: Optional[Dict[str, Any]]
    nodes: Optional[int]
    own_name: Dict[str, Any]
    skipped: str
    skipped_hosts: int


class MemlockPathsFacts(TypedDict, total=False):
    """Facts at ``memlock_paths``: the locked-memory limit on each path a rank starts by."""

    container: Dict[str, Any]
    launcher: Optional[str]
    limits_d: Any
    ranks: List[Dict[str, Any]]
    shell: Dict[str, Any]
    skipped: str
    ssh: List[Dict[str, Any]]
    ssh_skipped: Optional[str]


class LauncherToolsFacts(TypedDict, total=False):
    """Facts at ``launcher_tools``: the program the DeepSpeed launcher's multi-node backend needs."""

    backend: Optional[str]
    needed: bool
    others: Dict[str, Any]
    path: Optional[str]
    skipped: str
    tool: Optional[Dict[str, Any]]
    why: Optional[str]


class OriginsFacts(TypedDict, total=False):
    """Facts at ``origins``: where each symptom's message comes from in the training environment's code."""

    env: Dict[str, Optional[str]]
    index: Dict[str, Any]
    origins: Dict[str, List[Dict[str, Any]]]
    skipped: str


class SlurmJobFacts(TypedDict, total=False):
    """Facts at ``slurm_job``: the Slurm job and step the job runs in, and its memory request."""

    bad: List[str]
    in_job: bool
    job_id: Optional[str]
    request: Optional[Dict[str, Any]]
    skipped: str
    step_id: Optional[str]
    variables: Dict[str, Any]


class SwapsourceFacts(TypedDict, total=False):
    """Facts at ``swapsource``: the NVMe parameter swapper's buffer assertions in the installed DeepSpeed."""

    asserts: List[Dict[str, Any]]
    file: str
    min_aio_bytes: Optional[int]
    skipped: str
    version: Optional[str]


class IbverbsFacts(TypedDict, total=False):
    """Facts at ``ibverbs``: the RDMA user space (libibverbs, providers, /dev/infiniband) against the ACTIVE ports."""

    config: Dict[str, Any]
    container: Dict[str, Any]
    device_files: Dict[str, Any]
    distro: Dict[str, Any]
    libibverbs: Dict[str, Any]
    ports: List[Dict[str, Any]]
    problems: List[Dict[str, Any]]
    providers: List[Dict[str, Any]]
    python_error: Optional[str]
    skipped: str
    uverbs: Dict[str, Any]


class ArchtrialFacts(TypedDict, total=False):
    """Facts at ``archtrial``: the arch list proposed for a GPU newer than nvcc, compiled by that nvcc."""

    arch_list: str
    error: Optional[str]
    flags: List[str]
    nvcc: Optional[str]
    ok: Optional[bool]
    skipped: str
    tried: bool
    why: Optional[str]
