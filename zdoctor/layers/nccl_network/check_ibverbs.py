"""Check ``nccl.verbs``: the node's InfiniBand / RoCE ports are ACTIVE, but can a process here use them? The
verbs library, each device's provider and the ``/dev/infiniband/uverbsN`` files, judged by
:func:`zdoctor.layers.nccl_network.verbs.judge`. Inside a container the ports are the host's while the
libraries are the image's and the device files those the runtime passed in, so the remedies are for the
image (the distribution's packages) and for the runtime's device flags (named for the runtime detected)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.packages import managers, package_name
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.nccl_network import verbs
from zdoctor.symptoms.match import ids_for

KIND = "nccl-ib-verbs"
LIBRARY_KINDS = ("libibverbs-missing", "provider-missing", "provider-unconfigured")
#: The Kubernetes resource of NVIDIA's RDMA shared device plugin in its default configuration.
K8S_RDMA_RESOURCE = "rdma/hca_shared_devices_a"


def _image_remedies(problems: Sequence[Mapping[str, Any]], box: Mapping[str, Any],
                    distro: Mapping[str, Any]) -> list[Remedy]:
    """One remedy per package manager the image may use (apt and dnf when its distribution is unknown)."""
    inside = bool(box.get("in_container"))
    what = "; ".join(p["short"] for p in problems)
    out = []
    for m in managers(distro):
        if m.family not in ("apt", "dnf"):
            continue
        pkgs = package_name("rdma verbs", m.family)
        steps = m.install(" ".join(shlex.quote(p) for p in pkgs.split()))
        if inside:
            out.append(Remedy(
                title=f"Add the verbs library and its providers to the image ({m.label}: {pkgs})",
                commands=[f"# in the image's Dockerfile: RUN {' && '.join(steps)}"],
                note="not tried, because the image is built outside this container: a package installed in a "
                     "running container is gone when it restarts",
                explanation=f"{what}. The packages put libibverbs.so.1, the provider libraries "
                            "(lib<name>-rdmav<ABI>.so) and their /etc/libibverbs.d/*.driver files into the image; "
                            "the ports and the kernel driver are the host's already."))
        else:
            out.append(Remedy(
                title=f"Install the verbs library and its providers ({m.label}: {pkgs})", commands=steps,
                requires_root=True, note="not tried, because it installs packages on the node",
                explanation=f"{what}. The packages put libibverbs.so.1, the provider libraries and their "
                            "/etc/libibverbs.d/*.driver files in place."))
    return out


def _device_flags(files: Sequence[str], runtime: str | None) -> list[Remedy]:
    """How the runtime detected passes the device files in (Docker's and Podman's flags are the same)."""
    devs = [f"/dev/infiniband/{f}" for f in files]
    flags = " ".join(f"--device={shlex.quote(d)}" for d in [*devs, "/dev/infiniband/rdma_cm"])
    docker = Remedy(
        title=f"Start the container with the RDMA device files ({runtime or 'docker or podman'})",
        commands=[f"# add to `{'podman' if runtime == 'podman' else 'docker'} run`: {flags} --cap-add=IPC_LOCK "
                  "--ulimit memlock=-1:-1"],
        note="not tried, because a container's devices are fixed when it starts",
        explanation="The runtime passes only the device files it is given: --device makes each "
                    "/dev/infiniband/uverbsN (and rdma_cm) a device file inside, IPC_LOCK and an unlimited "
                    "memlock let NCCL register (pin) its buffers.")
    k8s = Remedy(
        title="Give the pod the RDMA devices (Kubernetes)",
        commands=[f"# in the pod spec: resources.limits: {{{K8S_RDMA_RESOURCE}: 1}} (NVIDIA's RDMA shared device "
                  "plugin) and securityContext.capabilities.add: [IPC_LOCK]"],
        note="not tried, because a pod's devices are fixed when it is created",
        explanation="The RDMA device plugin adds /dev/infiniband/uverbsN to the containers that request its "
                    "resource; a pod with hostNetwork: true and privileged: true sees the host's /dev/infiniband "
                    "instead, at the cost of isolation.")
    if runtime == "kubernetes":
        return [k8s]
    if runtime in ("docker", "podman"):
        return [docker]
    return [docker, k8s]


def _runtime(box: Mapping[str, Any]) -> str | None:
    """The runtime whose flags pass devices in: Kubernetes when the pod's variables say so (its nodes may run
    docker or containerd underneath, but the pod spec decides), else the runtime detected."""
    if not box.get("in_container"):
        return None
    if any(s.get("sign") == "KUBERNETES_SERVICE_HOST" and s.get("present") for s in box.get("signs") or []):
        return "kubernetes"
    return box.get("kind")


@check("nccl.verbs", title="Whether a process here can use the InfiniBand / RoCE ports (libibverbs, providers, "
       "/dev/infiniband)", probes=("ibverbs",), explains=(KIND,), layer="nccl-network")
def check_verbs(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("ibverbs"), facts.why_not("ibverbs"), sub="not-checked")
    if f.get("skipped"):
        return [me.not_checked(f"not examined: {f['skipped']}", sub="not-checked")]
    ev = facts.evidence("ibverbs")
    box = f.get("container") or {}
    runtime = _runtime(box)
    where = f"in this {runtime} container" if runtime else "in this container" if box.get("in_container") else "here"
    ports = f.get("ports") or []
    shown = ", ".join(f"{p['device']}:{p['port']}" for p in ports)
    problems = f.get("problems") or []
    lib = f.get("libibverbs") or {}
    if not problems:
        provs = ", ".join(f"{p['name']} ({p['path']})" for p in f.get("providers") or []) or "none needed"
        files = ", ".join(x["name"] for x in (f.get("device_files") or {}).get("files") or [])
        return [me.finding(status="ok", title=f"libibverbs, its providers and the device files for {shown} are "
                                              f"there {where}",
                           detail=f"{verbs.LIBIBVERBS} loads from {lib.get('path')} ({lib.get('via')}); providers: "
                                  f"{provs}; device files: {files or 'none listed in sysfs'} are character devices. "
                                  "Whether the device opens (permissions, the kernel driver) is not tried.",
                           evidence=ev)]
    lines = [f"ACTIVE ports in sysfs: {shown}.", *(p["text"] + "." for p in problems)]
    if box.get("in_container"):
        lines.append(f"This is a container ({', '.join(box.get('clues') or []) or runtime}): the ports are the "
                     "host's, the libraries are the image's and the device files are those the runtime passed in.")
    if f.get("python_error"):
        lines.append(f"The training interpreter was not found ({f['python_error']}): the library search is the "
                     "system's.")
    lines.append("NCCL then uses sockets for inter-node traffic (slow), or fails where NCCL_NET=IB asks for "
                 "InfiniBand.")
    kinds = {p["kind"] for p in problems}
    image: list[Remedy] = []
    if kinds & set(LIBRARY_KINDS):
        image = _image_remedies([p for p in problems if p["kind"] in LIBRARY_KINDS], box, f.get("distro") or {})
    missing = [u for p in problems if p["kind"] == "uverbs-missing" for u in p.get("files") or []]
    device: list[Remedy] = []
    if missing:
        if box.get("in_container"):
            device = _device_flags(missing, runtime)
        else:
            device.append(Remedy(title="Load the user-verbs kernel module that creates /dev/infiniband/uverbsN",
                              commands=["modprobe ib_uverbs"], requires_root=True,
                              note="not tried, because it loads a kernel module",
                              explanation="Outside a container the device files come from the ib_uverbs module "
                                          "(udev creates them when it loads)."))
    if image and device:
        lines.append("Both need fixing: the libraries and the device files.")
        if len(image) == 1 and len(device) == 1:  # one fix in two steps, not two alternatives
            image[0].step = device[0].step = True
    rem = image + device
    return [me.finding(status="fail", title=f"The InfiniBand ports are ACTIVE, but {problems[0]['short']} {where}",
                       detail="\n".join(lines), evidence=ev, remedies=rem, explains=ids_for(facts, KIND))]
