"""`zdoctor fleet` and NCCL's network: three nodes (one sshd inside a network namespace, one address per node),
two on one network and one whose NCCL_SOCKET_IFNAME names an interface on another: the skew table's NCCL
interface and address columns, and the reach check from the nodes' recorded routes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sshkit import node_bin, require, start_sshd

ROOT = Path(__file__).resolve().parent.parent
NS = f"h6fleet{os.getpid()}"
A, B, C = "10.61.1.1", "10.61.1.2", "10.61.2.1"
SETUP = [f"ip netns add {NS}", f"ip -n {NS} link set lo up",
         f"ip -n {NS} link add h6a type veth peer name h6ap", f"ip -n {NS} addr add {A}/24 dev h6a",
         f"ip -n {NS} addr add {B}/24 dev h6a",
         f"ip -n {NS} link add h6b type veth peer name h6bp", f"ip -n {NS} addr add {C}/24 dev h6b",
         *(f"ip -n {NS} link set {i} up" for i in ("h6a", "h6ap", "h6b", "h6bp"))]


@pytest.fixture(scope="module")
def fleet_doc(tmp_path_factory: pytest.TempPathFactory):
    require("/usr/sbin/sshd", "ssh", "ip")
    root = tmp_path_factory.mktemp("ncclfleet")
    sshd = None
    try:
        for cmd in SETUP:
            r = subprocess.run(cmd.split(), capture_output=True, text=True, timeout=20)
            assert r.returncode == 0, (cmd, r.stderr)
        good = node_bin(root / "bin")
        base = {"PATH": f"{good}:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
        sshd = start_sshd(root / "sshd", {A: {**base, "NCCL_SOCKET_IFNAME": "h6a"}, B: base,
                                          C: {**base, "NCCL_SOCKET_IFNAME": "=h6b"}}, netns=NS)
        hf = root / "hostfile"
        hf.write_text(f"{A} slots=1\n{B} slots=1\n{C} slots=1\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "MASTER_"))}
        r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "zdoctor", "fleet", "--hostfile", str(hf),
                            "--launcher", "ssh", "--ssh-config", str(sshd.ssh_config), "--zdoctor", "zdoctor-node",
                            "--timeout", "120", "--json", "--no-log"], capture_output=True, text=True, timeout=300,
                           cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(root / "state")})
        yield r
    finally:
        if sshd is not None:
            sshd.stop()
        subprocess.run(["ip", "netns", "del", NS], capture_output=True, timeout=20)


def test_the_skew_table_shows_each_nodes_nccl_interface_and_address(fleet_doc):
    assert fleet_doc.returncode == 1, fleet_doc.stderr
    doc = json.loads(fleet_doc.stdout)
    assert doc["summary"]["reached"] == 3, [n["launch"] for n in doc["nodes"]]
    skew = {r["id"]: r for r in doc["skew"]}
    assert skew["nccl-interface"]["values"] == {A: "h6a", B: "h6a", C: "h6b"}
    assert skew["nccl-interface"]["differing"] == [C]
    assert skew["nccl-address"]["values"] == {A: f"{A}/24", B: f"{A}/24", C: f"{C}/24"}
    assert skew["nccl-address"]["judged"] is False and skew["nccl-address"]["differing"] == []
    assert skew["nccl-mtu"]["differing"] == []


def test_the_reach_check_names_the_paths_that_leave_through_another_interface(fleet_doc):
    doc = json.loads(fleet_doc.stdout)
    reach = doc["reach"]
    assert reach["status"] == "fail" and reach in doc["findings"]
    rows = {(r[0], r[2]): r[6] for r in reach["evidence"][0]["table"]["rows"]}
    assert rows[(A, B)] == "reaches" and rows[(B, A)] == "reaches"
    assert rows[(A, C)] == f"{A} routes it through h6b, not h6a"
    assert rows[(C, A)] == f"{C} routes it through h6a, not h6b"
    assert sorted(k for k, v in rows.items() if v != "reaches") == [(A, C), (B, C), (C, A), (C, B)]
