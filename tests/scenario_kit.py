"""Record the practice scenario "offload on a slow SATA SSD, fixed by an NVMe drive" (part 2 of the story).

The offload facts (ds_config lints, the memory planner, the training log's breakdown) are probed live
from real files; the storage facts come from the recorded ``ssd-node`` block-device tree (an NVMe node
whose offload path sits on a SATA SSD, with a blank NVMe drive). The ds_config's nvme_path must exist
while recording (its lints look at it): ``/ssd/offload`` is created for the recording and removed again.

    python tests/scenario_kit.py assets/scenarios/slow-ssd-offload.json
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIX = HERE / "fixtures"
NODE = FIX / "storage" / "ssd-node"
OFFLOAD_PATH = "/ssd/offload"
HOSTNAME = "train-node-01"


def scrub(text: str) -> str:
    """Replace the recording machine's own paths with the scenario node's plausible ones."""
    import sysconfig

    repo = str(HERE.parent)
    base = sysconfig.get_config_var("prefix") or sys.base_prefix
    swaps = [(str(FIX / "offload"), "/home/alice/job"),
             (os.path.join(repo, "zdoctor"), "/opt/python/3.11.7/lib/python3.11/site-packages/zdoctor"),
             (repo, "/home/alice"),
             (base, "/opt/python/3.11.7"),
             (os.path.realpath(base), "/opt/python/3.11.7"),
             (os.path.expanduser("~/.pyenv/shims"), "/usr/local/bin")]
    text = text.replace(os.environ.get("PATH", "\0"), "/opt/python/3.11.7/bin:/usr/local/bin:/usr/bin:/bin")
    for real, shown in swaps:
        text = text.replace(real, shown)
    return text.replace('"' + os.path.expanduser("~") + '"', '"/home/alice"')


def record_slow_ssd(out: Path | None = None) -> dict:
    """The scenario's snapshot document (written to ``out`` when given)."""
    import zdoctor.probes.storage as ps
    from zdoctor.host import LiveHost
    from zdoctor.host.replay import snapshot_document
    from zdoctor.redact import redact
    from zdoctor.registry import load_vocabulary
    from zdoctor.storage import blockdev as bd

    load_vocabulary()
    made = not os.path.exists(OFFLOAD_PATH)
    os.makedirs(OFFLOAD_PATH, exist_ok=True)
    try:
        live = LiveHost(options={"ds_config": str(FIX / "offload" / "zero3-nvme-on-ssd.json"),
                                 "model_params": "13B", "gpus_per_node": 8,
                                 "train_log": str(FIX / "offload" / "ds-0.17-wallclock-nvme.log")})
        for name in ("dsconfig", "capacity", "trainlog", "gpusample"):
            live.result(name)
        doc = snapshot_document(live)
    finally:
        if made:
            shutil.rmtree(os.path.dirname(OFFLOAD_PATH), ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = tmp
        bd.build_tree((NODE / "tree.txt").read_text(), tmp)
        kw = dict(sysfs_root=os.path.join(tmp, "sys"), dev_root=os.path.join(tmp, "dev"),
                  udev_root=os.path.join(tmp, "run/udev"), mountinfo=str(NODE / "mountinfo"), live=False)
        storage = ps.collect_storage(OFFLOAD_PATH, source="ds_config zero_optimization.offload_optimizer.nvme_path",
                                     explicit=False, fstab_path="/etc/fstab", **kw)
        inventory = ps.collect_inventory(swaps=str(NODE / "swaps"), **kw)
    for name, (facts, evidence) in (("storage", storage), ("nvme_inventory", inventory)):
        doc["probes"][name] = {"probe": name, "status": "ok", "facts": facts,
                               "evidence": [e.to_dict() for e in evidence], "error": None,
                               "started": doc["created"], "duration_s": 0.0}
    doc["host"] = {**doc["host"], "hostname": HOSTNAME, "os": "Ubuntu 22.04.4 LTS", "python": "python3",
                   "options": {k: (os.path.join("/home/alice/job", os.path.basename(str(v)))
                                   if k in ("ds_config", "train_log") else v)
                               for k, v in doc["host"].get("options", {}).items()}}
    text = json.dumps(doc, indent=1, sort_keys=True)
    text = text.replace(tmp_root, "")  # the recorded tree's /dev paths become the node's own
    text = scrub(text)
    doc = redact(json.loads(text))
    if out is not None:
        Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    record_slow_ssd(Path(sys.argv[1]))
