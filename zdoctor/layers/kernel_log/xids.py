"""NVIDIA Xid events by number: what each means and what to do, as data.

Source: NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid
Catalog"), whose "Resolution Bucket (Immediate Action)" column is ``action`` here: RESTART_APP (the
application's context was lost; the GPU is fine), RESET_GPU (the GPU must be reset, or the node rebooted,
before it is trusted again), RESTART_BM (reboot the node), CONTACT_SUPPORT (hardware: drain the node, and
an RMA when it repeats). ``kind`` groups them the way a report reads them: bus, memory, application, gsp,
nvlink, driver.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Xid:
    number: int
    kind: str
    meaning: str
    #: The catalogue's immediate action: RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT, IGNORE.
    action: str
    #: fail: the GPU is not fit for training until acted on; warn: an application fault or a notice.
    status: str
    todo: str


#: What to do after a fault of the GPU's micro-controller, and after one of its System Processor (GSP).
_MICROCONTROLLER_TODO = "reset the GPU or reboot; report it to NVIDIA with nvidia-bug-report.sh if it repeats"
_GSP_TODO = "reset the GPU or reboot the node; update the driver if it repeats"

XIDS: dict[int, Xid] = {x.number: x for x in (
    Xid(13, "application", "Graphics engine exception: a kernel faulted (out-of-range access, illegal "
        "instruction)", "RESTART_APP", "warn",
        "an application fault, not the GPU: run the failing job with CUDA_LAUNCH_BLOCKING=1 (or "
        "compute-sanitizer) to find the kernel; the GPU needs no reset"),
    Xid(31, "application", "GPU memory page fault: a kernel accessed an address it does not own",
        "RESTART_APP", "warn",
        "an application fault (an illegal address, usually a bug or a mismatched extension): restart the "
        "job; the GPU needs no reset"),
    Xid(43, "application", "GPU stopped processing: the application's channel was reset after a fault",
        "RESTART_APP", "warn",
        "the process that faulted was stopped; restart the job (the other processes on the GPU keep running)"),
    Xid(45, "application", "Preemptive cleanup after an earlier error (the process was killed or faulted)",
        "IGNORE", "warn", "follows another Xid or a killed process: read the record before it"),
    Xid(48, "memory", "Double-bit ECC error (DBE): data in GPU memory was lost", "RESET_GPU", "fail",
        "drain the node and reset the GPU (row remapping or page retirement applies at the reset); if it "
        "comes back, the GPU needs an RMA"),
    Xid(61, "driver", "Internal micro-controller breakpoint/warning", "RESET_GPU", "fail", _MICROCONTROLLER_TODO),
    Xid(62, "driver", "Internal micro-controller halt", "RESET_GPU", "fail", _MICROCONTROLLER_TODO),
    Xid(63, "memory", "ECC page retirement or row remapping recorded: a memory row is marked for remapping",
        "RESET_GPU", "warn",
        "the remapping takes effect at the next GPU reset: reset the GPU when the jobs allow"),
    Xid(64, "memory", "ECC page retirement or row remapping failed to record", "RESET_GPU", "fail",
        "drain the node and reset the GPU; repeated failures mean the GPU needs an RMA"),
    Xid(74, "nvlink", "NVLink error", "RESET_GPU", "fail",
        "reset the GPU (and check the NVLink state with `nvidia-smi nvlink -s`); an RMA if it repeats"),
    Xid(79, "bus", "GPU has fallen off the bus: the GPU stopped answering on PCIe", "RESET_GPU", "fail",
        "drain the node and reset the GPU (usually a reboot: a GPU off the bus rarely resets in place); "
        "check the PCIe AER records, power and cooling of the slot; an RMA if it repeats"),
    Xid(92, "memory", "High single-bit ECC error rate", "IGNORE", "warn",
        "corrected errors: watch the ECC counters; a rising rate precedes uncorrectable errors"),
    Xid(94, "memory", "Contained ECC error: an uncorrectable error was contained to the application that "
        "touched it", "RESTART_APP", "fail",
        "the affected process was stopped: restart the job; reset the GPU when the jobs allow so the "
        "remapping takes effect"),
    Xid(95, "memory", "Uncontained ECC error: an uncorrectable error every process on the GPU may have "
        "seen", "RESET_GPU", "fail",
        "drain the node and reset the GPU before any job uses it; an RMA if it repeats"),
    Xid(119, "gsp", "GSP RPC timeout: the GPU System Processor did not answer the driver", "RESET_GPU", "fail",
        _GSP_TODO),
    Xid(120, "gsp", "GSP error: the GPU System Processor reported an error", "RESET_GPU", "fail", _GSP_TODO),
    Xid(154, "driver", "GPU recovery action changed: the driver says which recovery the GPU needs",
        "IGNORE", "warn", "read the record's text: it names the action (GPU reset, node reboot, drain and reset)"),
)}

#: What a Xid number not in the table gets.
CATALOGUE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


def xid(number: int) -> Xid | None:
    """The catalogue entry of Xid ``number``, or None when zdoctor does not know it."""
    return XIDS.get(number)


@dataclass(frozen=True)
class DriverFault:
    """An Xid that some driver releases raise by a bug of their own: on those releases it is the driver's
    fault, fixed by a newer release of the branch, not failing hardware."""

    number: int
    #: The driver branch (``525``) whose releases before ``fixed_in`` have the bug.
    branch: int
    fixed_in: str
    what: str
    source: str


#: Driver-side Xid faults, each from NVIDIA's release notes.
DRIVER_FAULTS: tuple[DriverFault, ...] = (
    DriverFault(119, 525, "525.105.17",
                "a GSP-RM bug that could lead to GSP RPC timeout errors (Xid 119), introduced in the first 525 "
                "release and not present in earlier drivers",
                "NVIDIA Data Center GPU Driver Release Notes 525 (v3.0), fixed issues of 525.105.17"),
)

#: Xids that end one application's context: the GPU is fine, so never a reason for an RMA or a reboot.
APPLICATION_FAULTS = frozenset(x.number for x in XIDS.values() if x.kind == "application")


def _release(text: str | None) -> tuple[int, ...] | None:
    parts = (text or "").strip().split(".")
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None


def driver_fault(number: int, release: str | None) -> DriverFault | None:
    """The driver bug that explains Xid ``number`` on driver ``release`` (``525.85.12``), or None (also when
    the release is unknown)."""
    have = _release(release)
    if have is None:
        return None
    for fault in DRIVER_FAULTS:
        fixed = _release(fault.fixed_in) or ()
        if fault.number == number and have[0] == fault.branch and have < fixed:
            return fault
    return None
