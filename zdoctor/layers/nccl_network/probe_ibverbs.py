"""Probe ``ibverbs``: whether a process of the training can use the node's InfiniBand / RoCE ports: the ACTIVE
ports in sysfs, the libibverbs the training interpreter would load, the provider each device needs, the
``/etc/libibverbs.d`` files that name the providers, the ``/dev/infiniband/uverbsN`` files, and whether this
is a container (and which runtime), whose image and device flags decide the last three.

Facts (see :mod:`zdoctor.layers.nccl_network.verbs`): ``ports`` [{device, port, link_layer}] (the ACTIVE
ones), ``uverbs`` {uverbs [{uverbs, ibdev}], error}, ``device_files`` {dir, dir_exists, files [{name,
state}]}, ``config`` {dir, exists, files [{file, drivers}], error}, ``libibverbs`` {path, via, error, loads,
pabi, tried}, ``providers`` [{name, path, error, others}], ``problems`` [{kind, text, ...}], ``container``
(:func:`zdoctor.readers.containerdetect.detect`), ``distro`` (os-release), ``skipped``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.factstypes import IbverbsFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.nccl_network import infiniband, verbs
from zdoctor.layers.toolchain.probe_toolchain import OS_RELEASE, read_os_release
from zdoctor.proc.target import target_of
from zdoctor.readers import containerdetect
from zdoctor.readers.loader import LoaderConfig


def collect_verbs(env: Mapping[str, str], exe: str | None, *, sysfs: str = verbs.SYSFS, dev: str = verbs.DEV,
                  config_dir: str = verbs.CONFIG_DIR, loader: LoaderConfig | None = None,
                  extra_provider_dirs: Sequence[str] = verbs.PROVIDER_DIRS, root: str = "/",
                  os_release: str = OS_RELEASE) -> tuple[dict[str, Any], list[Evidence]]:
    """The facts, with every root a test or a recorded tree can stand in for."""
    ib = infiniband.read_devices(os.path.join(sysfs, "class", "infiniband"))
    ports = [{"device": d["name"], "port": p["port"], "link_layer": p.get("link_layer")}
             for d in ib.get("devices") or [] for p in d.get("ports") or [] if p.get("state") == "ACTIVE"]
    facts: dict[str, Any] = {"ports": ports, "container": containerdetect.detect(env, root=root),
                             "distro": read_os_release(os_release)}
    if not ports:
        facts["skipped"] = (f"no ACTIVE InfiniBand / RoCE port under {ib.get('root')}" if ib.get("devices") else
                            f"no InfiniBand / RoCE device under {ib.get('root')}")
        return facts, []
    uverbs = verbs.read_uverbs(sysfs)
    devices = sorted({p["device"] for p in ports})
    by_dev = {u.get("ibdev"): u["uverbs"] for u in uverbs["uverbs"]}
    files = verbs.read_device_files(dev, [by_dev[d] for d in devices if d in by_dev])
    config = verbs.read_driver_config(config_dir)
    lib = verbs.resolve_libibverbs(exe, env, loader or LoaderConfig.detect())
    dirs = verbs.provider_dirs(lib.get("path"), extra_provider_dirs)
    names = sorted({n for n in (verbs.provider_for(d) for d in devices) if n})
    providers = [verbs.find_provider(n, dirs, lib.get("pabi")) for n in names]
    problems = verbs.judge(ports, uverbs, files, config, lib, providers)
    facts.update(uverbs=uverbs, device_files=files, config=config, libibverbs=lib, providers=providers,
                 problems=problems)
    state = {f["name"]: f["state"] for f in files["files"]}
    rows = [[d, by_dev.get(d, "?"), state.get(by_dev.get(d, ""), "not in sysfs"), verbs.provider_for(d) or "?",
             next((p.get("path") or p.get("error") or "" for p in providers if p["name"] == verbs.provider_for(d)),
                  "")] for d in devices]
    lib_line = (f"{verbs.LIBIBVERBS}: {lib['path']} (via {lib.get('via')}, provider ABI {lib.get('pabi') or '?'})"
                if lib.get("loads") else f"{verbs.LIBIBVERBS}: does not load ({lib.get('error')})")
    conf = ", ".join(f"{f['file']} ({' '.join(f['drivers']) or 'no driver line'})" for f in config["files"]) or \
        ("empty" if config["exists"] else "does not exist")
    ev = [Evidence.of_table("RDMA devices with an ACTIVE port, against what a process here needs to open them",
                            ["device", "uverbs", f"{files['dir']}/<uverbs>", "provider", "provider library"], rows,
                            [i for i, r in enumerate(rows) if r[2] != "char"]),
          Evidence.note("the verbs library and its providers",
                        f"{lib_line}\n{config['dir']}: {conf}\nsource: " + "; ".join(verbs.SOURCES))]
    return facts, ev


@probe("ibverbs", title="The RDMA user space: libibverbs, the providers and /dev/infiniband", timeout=30.0,
       facts=IbverbsFacts)
def ibverbs_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    target = target_of(host)
    exe, _, why = target.resolve_python()
    facts, ev = collect_verbs(target.env, exe)
    if exe is None and not facts.get("skipped"):
        facts["python_error"] = why
    return facts, ev
