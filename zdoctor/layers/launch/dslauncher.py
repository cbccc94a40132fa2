"""How the DeepSpeed launcher (``deepspeed``, deepspeed/launcher/runner.py) treats the devices and cores of a
node, by release, as data with sources, and which behaviour the installed release has, read from its own
runner.py (as :mod:`zdoctor.layers.python_env.dsrules` does for the other rules).

The launcher's history for a ``CUDA_VISIBLE_DEVICES`` set on the launching node (single node, no hostfile,
no ``--include``/``--exclude``/``--num_gpus``/``--num_nodes``), read from the release tags of the
DeepSpeed repository:

- ``ignored`` (up to 0.5.6): the variable is not read; the launcher counts the GPUs and sets its own
  ``CUDA_VISIBLE_DEVICES`` for each rank (DeepSpeed issue 662).
- ``count-checked`` (PR 960, merged 2021-11-17, first in 0.5.7): the list becomes
  ``--include=localhost:LIST`` and is checked against slots ``0..N-1`` of ``localhost``, N the launcher's
  GPU count. When that count was taken with the variable still set, a list that is not ``0,1,...,k-1``
  (``1``, ``0,2``, ``4,5``) fails with ``No slot 'I' specified on host 'localhost'`` (issues 1331, 2976,
  4248, 5818).
- ``index-seeded`` (PR 6530, merged 2024-10-08, first in 0.15.2): the listed indices are the slots, so any
  list is taken.

``--bind_cores_to_rank`` (PR 2881, merged 2023-04-13, first in 0.9.0) runs each rank under ``numactl`` on
its share of the cores and sets its ``OMP_NUM_THREADS`` to that share.
"""

from __future__ import annotations

import re
from typing import Any

from zdoctor.layers.python_env.dsrules import parse_version, read_source

RUNNER_FILES = ("launcher/runner.py",)

RULES: list[dict[str, Any]] = [
    {"id": "visible-devices",
     "about": "a CUDA_VISIBLE_DEVICES set on the launching node, single node, no resource options",
     "states": {
         "ignored": "the launcher does not read it: it uses every GPU it counts and sets CUDA_VISIBLE_DEVICES "
                    "for each rank itself",
         "count-checked": "it becomes --include=localhost:LIST, checked against slots 0..N-1 of the GPUs the "
                          "launcher counts; a list other than 0,1,...,k-1 can fail with \"No slot 'I' "
                          "specified on host 'localhost'\"",
         "index-seeded": "the listed GPU indices are the slots: any list is taken",
     },
     "sources": ["DeepSpeed issue 662 (CUDA_VISIBLE_DEVICES not respected, 2021-01)",
                 "DeepSpeed PR 960 '[launcher/runner] respect CUDA_VISIBLE_DEVICES for a single node' "
                 "(merged 2021-11-17, tag v0.5.7)",
                 "DeepSpeed issues 1331, 2976, 4248, 5818 (\"No slot 'N' specified on host 'localhost'\")",
                 "DeepSpeed PR 6530 'Fix device selection using CUDA_VISIBLE_DEVICES' (merged 2024-10-08, "
                 "tag v0.15.2): parse_inclusion_exclusion seeds the slots from the --include list"],
     "release": "0.5.7 to 0.15.1: count-checked; 0.15.2 and later upstream: index-seeded; the installed "
                "runner.py decides"},
    {"id": "bind-cores-to-rank",
     "about": "deepspeed --bind_cores_to_rank / --bind_core_list",
     "states": {"absent": "the launcher has no option to bind ranks to cores",
                "present": "each rank runs under numactl on total_cores // ranks cores of its own, and its "
                           "OMP_NUM_THREADS is set to that number"},
     "sources": ["DeepSpeed PR 2881 '[CPU support] Optionally bind each rank to different cores on host' "
                 "(merged 2023-04-13, tag v0.9.0)",
                 "deepspeed/launcher/launch.py and deepspeed/utils/numa.py get_numactl_cmd"],
     "release": "0.9.0 and later"},
]

RULES_BY_ID = {r["id"]: r for r in RULES}

_SEEDED = re.compile(r"node_configs\[hostname\]\s+if\s+hostname\s+in\s+node_configs")


def decide(rule_id: str, text: str) -> dict[str, Any]:
    """Which state of ``rule_id`` the runner.py source ``text`` has (``state``, and ``why`` when unknown)."""
    if rule_id == "visible-devices":
        if "def parse_inclusion_exclusion" not in text:
            return {"state": "unknown", "why": "no parse_inclusion_exclusion in runner.py"}
        if _SEEDED.search(text):
            return {"state": "index-seeded"}
        if "setting --include" in text and ("VISIBLE_DEVICES" in text):
            return {"state": "count-checked"}
        if "CUDA_VISIBLE_DEVICES" not in text and "visible_devices" not in text:
            return {"state": "ignored"}
        return {"state": "unknown", "why": "runner.py reads CUDA_VISIBLE_DEVICES in a way zdoctor does not know"}
    if rule_id == "bind-cores-to-rank":
        return {"state": "present" if "--bind_cores_to_rank" in text else "absent"}
    raise KeyError(rule_id)


def by_version(rule_id: str, version: tuple[int, ...]) -> str:
    """The state upstream's releases have at ``version`` (the tags above)."""
    if rule_id == "visible-devices":
        return "ignored" if version < (0, 5, 7) else "count-checked" if version < (0, 15, 2) else "index-seeded"
    return "absent" if version < (0, 9, 0) else "present"


def installed_launcher_rules(location: str | None, version: str | None) -> dict[str, dict[str, Any]]:
    """Per rule: the state of the installed release, read from its runner.py (``how``), else from its
    version by the release tags above; ``unknown`` when neither can say."""
    ver = parse_version(version)
    out: dict[str, dict[str, Any]] = {}
    text = path = err = None
    if location:
        path, text, err = read_source(location, RUNNER_FILES)
    for rule in RULES:
        rid = rule["id"]
        rec: dict[str, Any] = {"state": "unknown", "file": None, "how": None}
        if text is not None:
            rec.update(decide(rid, text), file=path, how="read from the installed runner.py")
        else:
            rec["why"] = err or "DeepSpeed's location is unknown"
        if rec["state"] == "unknown" and ver is not None:
            rec.update(state=by_version(rid, ver), how=f"from the release number {version} (the upstream tags)")
        out[rid] = rec
    return out
