"""The vocabulary playbooks may use: probes, checks and predicates, registered by name in code."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from zdoctor.core.model import Evidence, Finding, ProbeResult
from zdoctor.core.nodelayers import layer_of
from zdoctor.core.shape import shape_of

if TYPE_CHECKING:  # the facts' types are for the type checker; the guide's first screen does not load them
    from zdoctor.core import factstypes as ft


class ProbeHost(typing.Protocol):
    """What a probe needs of the host it runs on (a live node or a replayed snapshot): the results of the
    probes it reads, and what the host says about itself."""

    info: dict[str, Any]

    def result(self, name: str) -> ProbeResult: ...


#: A probe: its facts (the typed record it declares, see :mod:`zdoctor.core.factstypes`) and their evidence.
ProbeFunc = typing.Callable[[ProbeHost], "tuple[Mapping[str, Any], list[Evidence]]"]


class Facts(typing.Mapping[str, "ProbeResult"]):
    """Probe results by probe name, with a safe path lookup for predicates and checks."""

    def __init__(self, results: Mapping[str, ProbeResult]):
        self._results = dict(results)

    def __getitem__(self, name: str) -> ProbeResult:
        return self._results[name]

    def __iter__(self):
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    @typing.overload
    def of(self, probe: Literal["archtrial"]) -> ft.ArchtrialFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["capacity"]) -> ft.CapacityFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["container"]) -> ft.ContainerFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["cuda_stack"]) -> ft.CudaStackFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["cudalookup"]) -> ft.CudalookupFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["driver_parts"]) -> ft.DriverPartsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["driver_resume"]) -> ft.DriverResumeFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["dsconfig"]) -> ft.DsconfigFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["dsrelease"]) -> ft.DsreleaseFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["glibc"]) -> ft.GlibcFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["gpu_env"]) -> ft.GpuEnvFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["gpucap"]) -> ft.GpucapFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["gpusample"]) -> ft.GpusampleFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["host_limits"]) -> ft.HostLimitsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["hostfile"]) -> ft.HostfileFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["hostram"]) -> ft.HostramFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["ibverbs"]) -> ft.IbverbsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["infiniband"]) -> ft.InfinibandFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["jitbuildlog"]) -> ft.JitbuildlogFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["jitcache"]) -> ft.JitcacheFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["jitprereq"]) -> ft.JitprereqFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["kernel_log"]) -> ft.KernelLogFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["kernel_modules"]) -> ft.KernelModulesFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["launch"]) -> ft.LaunchFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["launcher_tools"]) -> ft.LauncherToolsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["libfix"]) -> ft.LibfixFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["libs"]) -> ft.LibsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["limitfix"]) -> ft.LimitfixFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["livetrace"]) -> ft.LivetraceFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["locktrial"]) -> ft.LocktrialFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["memlock_paths"]) -> ft.MemlockPathsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["nccl"]) -> ft.NcclFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["nccl_log"]) -> ft.NcclLogFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["nccl_net"]) -> ft.NcclNetFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["nvme_inventory"]) -> ft.NvmeInventoryFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["nvml"]) -> ft.NvmlFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["origins"]) -> ft.OriginsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["other_caches"]) -> ft.OtherCachesFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["p2p"]) -> ft.P2pFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["peers"]) -> ft.PeersFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["processes"]) -> ft.ProcessesFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["pyenv"]) -> ft.PyenvFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["rankcores"]) -> ft.RankcoresFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["ranks"]) -> ft.RanksFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["rendezvous"]) -> ft.RendezvousFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["shellinit"]) -> ft.ShellinitFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["shm_access"]) -> ft.ShmAccessFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["slurm_job"]) -> ft.SlurmJobFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["special_files"]) -> ft.SpecialFilesFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["stdcxx_links"]) -> ft.StdcxxLinksFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["storage"]) -> ft.StorageFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["swapsource"]) -> ft.SwapsourceFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["symbols"]) -> ft.SymbolsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["symptoms"]) -> ft.SymptomsFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["system"]) -> ft.SystemFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["toolchain"]) -> ft.ToolchainFacts | None: ...

    @typing.overload
    def of(self, probe: Literal["trainlog"]) -> ft.TrainlogFacts | None: ...

    @typing.overload
    def of(self, probe: str) -> Any: ...

    def of(self, probe: str) -> Any:
        """The facts of ``probe`` when it ran and answered (status ok), else None: for mypy, the record the probe
        declares (:mod:`zdoctor.factstypes`), so it checks the keys a check reads and the types of their values
        (a probe name it cannot see, a variable, gives Any)."""
        res = self._results.get(probe)
        return res.facts if res is not None and res.status == "ok" else None

    def why_not(self, probe: str) -> str:
        """Why ``probe`` gave no facts: its error, its skip reason, or that it did not run."""
        res = self._results.get(probe)
        if res is None:
            return f"the {probe} probe did not run"
        return res.error or (res.facts or {}).get("skipped") or f"the {probe} probe ended with status {res.status}"

    def evidence(self, *probes: str, kinds: tuple[str, ...] | None = ("table", "note"),
                 labels: tuple[str, ...] = ()) -> list[Any]:
        """The evidence of ``probes`` in order: only these kinds (``kinds=None`` keeps all), and only the
        pieces whose label is or starts with one of ``labels`` (when any are given)."""
        out: list[Any] = []
        for name in probes:
            res = self._results.get(name)
            if res is not None:
                out.extend(e for e in res.evidence if (kinds is None or e.kind in kinds)
                           and (not labels or e.label.startswith(labels)))
        return out


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    func: ProbeFunc
    title: str
    timeout: float
    needs: tuple[str, ...]
    #: Computed from other probes' results alone (never from the machine): a replayed snapshot that lacks
    #: it computes it from what it recorded.
    derived: bool = False
    #: No finding the user waits for first hangs on it: the commands it runs yield the CPU (a lower
    #: priority, see :func:`zdoctor.proc.contain.background`) to the training interpreter's import.
    background: bool = False
    #: The typed record of its facts (a TypedDict of :mod:`zdoctor.factstypes`): ``shape.json`` is made from it.
    facts: type | None = None


#: A probe's typed record, as :meth:`CheckSpec.require` hands it back.
Record = typing.TypeVar("Record")


class Concluded(Exception):
    """Raised inside a check that ends early (see :meth:`CheckSpec.require`): the function :func:`check`
    registers, which every call of a check goes through, answers with its ``findings`` as if returned."""

    def __init__(self, *findings: Finding) -> None:
        super().__init__("; ".join(f.title for f in findings))
        self.findings = list(findings)


@dataclass(frozen=True)
class CheckSpec:
    name: str
    func: Callable[[Facts], list[Finding]]
    title: str
    probes: tuple[str, ...]
    #: The symptom kinds its findings can explain (see :mod:`zdoctor.symptoms`).
    explains: tuple[str, ...] = ()
    #: The finding ids it can produce: exact ids, or ``family.*`` for ids made below ``family`` (one per
    #: op, per lint rule ...). ``NAME.not-checked`` and ``NAME.crash`` are always its own.
    findings: tuple[str, ...] = ()
    #: Probes it reads when they answered and never needs (a rule of the installed release, say).
    optional: tuple[str, ...] = ()
    #: The layer of the node it examines (see :mod:`zdoctor.core.nodelayers`), or "" for none of them.
    layer: str = ""
    #: Why its failing findings carry no remedy of their own on any node (they state what was seen, and the
    #: findings that name its cause carry the fixes); "" when a failing finding that names a cause must.
    no_remedy: str = ""

    def id(self, sub: str = "") -> str:
        """The id of its own finding, or of finding ``sub`` below it (``NAME.sub``)."""
        return f"{self.name}.{sub}" if sub else self.name

    def finding(self, status: str, title: str | None = None, *, sub: str = "", **fields: Any) -> Finding:
        """A finding of this check: its id (``sub`` names one below it) and, unless given, its declared title."""
        return Finding(id=self.id(sub), status=status, title=self.title if title is None else title, **fields)

    def not_checked(self, why: str, evidence: list[Evidence] | None = None, *, sub: str = "",
                    part: str = "") -> Finding:
        """The ``skip`` finding of this check when it could not look, with why: ``TITLE: not checked`` under its
        declared title, or ``TITLE (PART): not checked`` for the ``part`` of it that finding ``sub`` (below its
        name) stands for; ``sub`` alone (``not-checked``) keeps the plain form."""
        title = f"{self.title} ({part})" if part else self.title
        return not_checked(self.id(sub), title, why, evidence)

    def require(self, record: Record | None, why: str, evidence: list[Evidence] | None = None, *,
                sub: str = "") -> Record:
        """``record`` (a probe's facts, ``facts.of(...)``) when it is there; otherwise the check ends here with its
        not-checked finding saying ``why`` (:class:`Concluded`), so its code reads the record alone."""
        if record is None:
            raise Concluded(self.not_checked(why, evidence, sub=sub))
        return record

    def produces(self, fid: str) -> bool:
        """Whether it declares finding ``fid`` (or ``fid`` is a dotted prefix of ids it declares)."""
        if fid in (self.name, f"{self.name}.not-checked", f"{self.name}.crash"):
            return True
        for declared in self.findings:
            if declared.endswith(".*"):
                family = declared[:-2]
                if fid == family or fid.startswith(family + ".") or family.startswith(fid + "."):
                    return True
            elif fid == declared or declared.startswith(fid + "."):
                return True
        return False

    @property
    def reads(self) -> tuple[str, ...]:
        """Every probe it reads: its own, its optional ones, and ``symptoms`` and ``origins`` (where each
        message comes from) when it can explain one (those are read when there, never needed: a check judges
        its own subject whether or not they answered)."""
        extra = [*self.optional, *(["symptoms", "origins"] if self.explains else [])]
        return tuple(dict.fromkeys((*self.probes, *extra)))


def not_checked(fid: str, title: str, why: str, evidence: list[Evidence] | None = None) -> Finding:
    """The ``skip`` finding of a check that could not look: ``TITLE: not checked``, with the reason."""
    return Finding(id=fid, status="skip", title=f"{title}: not checked", detail=why, evidence=list(evidence or []))


#: A check as written: its facts and its own declaration (``me``), which gives its findings their ids and titles.
CheckFunc = typing.Callable[[Facts, "CheckSpec"], "list[Finding]"]


@dataclass(frozen=True)
class PredicateSpec:
    name: str
    func: Callable[[Facts], bool]
    doc: str
    probes: tuple[str, ...]


def facts_of(host: Any, name: str) -> dict[str, Any]:
    """Probe ``name``'s facts on ``host`` when it ran to the end there; ``{}`` otherwise (not registered,
    skipped, crashed, timed out, or the host could not say), never an exception: another probe's trouble
    only narrows what a probe reads."""
    if name not in PROBES:
        return {}
    try:
        res = host.result(name)
    except Exception:  # noqa: BLE001 - another probe's trouble must not take this one down
        return {}
    return res.facts if res.status == "ok" and isinstance(res.facts, dict) else {}


PROBES: dict[str, ProbeSpec] = {}
CHECKS: dict[str, CheckSpec] = {}
PREDICATES: dict[str, PredicateSpec] = {}

#: Packages whose ``probe_*`` and ``check_*`` modules register probes, checks and predicates when imported:
#: every node layer's package under :mod:`zdoctor.layers`, and the probes that belong to no layer (the
#: symptoms the user saw and where their messages come from, the node at a glance). A new module there is
#: found on its own (every probe module first, then every check module, each in the order of its name);
#: nothing else needs to name it.
VOCABULARY_ROOTS = ("zdoctor.layers",)
VOCABULARY_PACKAGES = ("zdoctor.symptoms", "zdoctor.host")
#: The prefixes of registering modules, in the order they are imported.
VOCABULARY_KINDS = ("probe_", "check_")


def vocabulary_packages() -> list[str]:
    """The packages whose registering modules :func:`vocabulary_modules` imports: each node layer's, then the rest."""
    names: list[str] = []
    for root in VOCABULARY_ROOTS:
        pkg = importlib.import_module(root)
        names += [f"{root}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if m.ispkg]
    return sorted(names) + list(VOCABULARY_PACKAGES)


def vocabulary_modules() -> list[str]:
    """Every ``probe_*`` module, then every ``check_*`` module, of :func:`vocabulary_packages`, found in the
    installed package (or the bundle), each kind in the order of its name: each registers vocabulary when
    imported (helpers that register nothing are named otherwise)."""
    found: list[tuple[int, str, str]] = []
    for package in vocabulary_packages():
        pkg = importlib.import_module(package)
        for m in pkgutil.iter_modules(pkg.__path__):
            for rank, prefix in enumerate(VOCABULARY_KINDS):
                if m.name.startswith(prefix):
                    found.append((rank, m.name, f"{package}.{m.name}"))
    return [name for _rank, _base, name in sorted(found)]


#: The vocabulary packages loaded whole so far (what :func:`load_vocabulary` need not walk again).
_loaded: list[tuple[tuple[str, ...], tuple[str, ...]]] = []


def load_vocabulary() -> None:
    """Import every module that registers vocabulary (idempotent: once loaded whole, a no-op)."""
    packages = (tuple(VOCABULARY_ROOTS), tuple(VOCABULARY_PACKAGES))
    if packages in _loaded:
        return
    for mod in vocabulary_modules():
        importlib.import_module(mod)
    _loaded.append(packages)


def declared_shape() -> dict[str, list[str]]:
    """The types at each key path of every probe's facts, from the typed records the probes declare: what
    ``shape.json`` holds (``bench/write_shape.py`` writes it)."""
    load_vocabulary()
    return shape_of({name: spec.facts for name, spec in sorted(PROBES.items()) if spec.facts is not None})


def probe(name: str, *, title: str, timeout: float = 30.0, needs: tuple[str, ...] = (), derived: bool = False,
          background: bool = False, facts: type | None = None):
    """Register ``func(host) -> (facts, evidence)`` as probe ``name``; ``needs`` are probes it reads;
    ``derived``: it reads nothing but them (and the job's options), so a replay can compute it;
    ``background``: its commands run at a lower CPU priority (see :attr:`ProbeSpec.background`);
    ``facts``: the typed record of its facts (:mod:`zdoctor.factstypes`)."""

    def deco(func: ProbeFunc) -> ProbeFunc:
        PROBES[name] = ProbeSpec(name, func, title, timeout, needs, derived, background, facts)
        return func

    return deco


def check(name: str, *, title: str, probes: tuple[str, ...], findings: tuple[str, ...] = (),
          explains: tuple[str, ...] = (), optional: tuple[str, ...] = (), layer: str = "", no_remedy: str = ""):
    """Register ``func(facts, me) -> [Finding]`` as check ``name`` reading the given probes (``me`` is its
    :class:`CheckSpec`: ``me.finding(...)`` and ``me.not_checked(why)`` take their id and title from this
    declaration; the registered function takes ``facts`` alone). ``findings`` are the
    ids it produces besides ``name`` itself (``family.*`` for a family); ``explains`` names the symptom kinds
    its findings can explain (the check then reads the ``symptoms`` probe too); ``optional`` are probes it
    reads when they answered; ``layer`` is the layer of the node it examines (:mod:`zdoctor.core.nodelayers`);
    ``no_remedy`` says why its failing findings carry no remedy of their own on any node."""

    def deco(func: CheckFunc) -> Callable[[Facts], list[Finding]]:
        @functools.wraps(func)
        def judged(facts: Facts) -> list[Finding]:
            try:
                return func(facts, spec)
            except Concluded as ended:  # it ended early: it could not look, or had nothing to judge
                return ended.findings

        spec = CheckSpec(name, judged, title, probes, tuple(explains), tuple(findings), tuple(optional),
                         layer_of(name, layer), no_remedy)
        CHECKS[name] = spec
        return judged

    return deco


def predicate(name: str, *, doc: str, probes: tuple[str, ...]):
    """Register ``func(facts) -> bool`` as a predicate playbook edges may name."""

    def deco(func: Callable[[Facts], bool]):
        PREDICATES[name] = PredicateSpec(name, func, doc, probes)
        return func

    return deco


def owner_check(fid: str, checks: Mapping[str, Any]) -> str | None:
    """The registered check that produces finding ``fid``: the check named ``fid``, or its longest dotted
    prefix that names one, or else the check that declares it (``findings=`` of its decorator)."""
    parts = fid.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in checks:
            return name
    for name, spec in checks.items():
        produces = getattr(spec, "produces", None)
        if callable(produces) and produces(fid):
            return name
    return None
