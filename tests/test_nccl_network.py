"""NCCL's network layer: NCCL's interface rules, real network namespaces (veth pairs, a bridge, an interface
without an address, a down one, a peer routed through another interface), InfiniBand/RoCE from recorded
sysfs trees, NCCL_DEBUG=INFO output, and the layer's 'not examined' parts in check --json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import Facts, load_vocabulary
from zdoctor.layers import evaluate_check
from zdoctor.layers.nccl_network import infiniband, nccllog, ncclnet
from zdoctor.layers.nccl_network.probe_ncclnet import nccl_log_probe
from zdoctor.proc.target import Target
from zdoctor.symptoms.extract import from_text

ROOT = Path(__file__).resolve().parent.parent
IB_TREES = Path(__file__).resolve().parent / "fixtures" / "infiniband"


def iface(name: str, index: int, *addrs: str, state: str = "UP") -> dict:
    out = []
    for a in addrs:
        local, _, plen = a.partition("/")
        out.append({"family": "inet6" if ":" in local else "inet", "local": local, "prefixlen": int(plen or 24)})
    return {"ifname": name, "ifindex": index, "operstate": state, "addrs": out}


NODE = [iface("lo", 1, "127.0.0.1/8", "::1/128"), iface("eth0", 2, "10.0.0.5/24", "fe80::1/64"),
        iface("eth1", 3), iface("eth10", 4, "10.0.10.5/24"), iface("docker0", 5, "172.17.0.1/16"),
        iface("ib0", 6, "192.168.0.5/24")]


def names(choice: dict) -> list[str]:
    return [c["ifname"] for c in choice["chosen"]]


# -- NCCL's rules ----------------------------------------------------------------------------------------


def test_socket_ifname_is_a_prefix_unless_exact_and_caret_excludes():
    assert names(ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "eth"})) == ["eth0", "eth10"]
    assert names(ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "eth1"})) == ["eth10"]  # eth1 has no address
    assert names(ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "=eth1"})) == []
    assert ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "=eth1"})["matched_without_address"] == ["eth1"]
    assert names(ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "^eth,lo,docker"})) == ["ib0"]
    assert names(ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "^=eth1,ib0"})) == ["lo", "eth0", "eth10", "docker0"]
    assert names(ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "docker0,eth0:1"})) == ["eth0", "docker0"]  # index order
    assert names(ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_FAMILY": "AF_INET6"})) == ["eth0"]
    assert ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_FAMILY": "AF_INET6"})["chosen"][0][
        "address"] == "fe80::1"


def test_the_default_order_prefers_ib_then_skips_docker_and_lo():
    assert names(ncclnet.choose(NODE, {})) == ["ib0"]
    no_ib = [i for i in NODE if i["ifname"] != "ib0"]
    assert names(ncclnet.choose(no_ib, {})) == ["eth0", "eth10"]
    assert names(ncclnet.choose(no_ib, {"NCCL_COMM_ID": "10.0.10.1:5000"})) == ["eth10"]  # its subnet
    only = [iface("lo", 1, "127.0.0.1/8"), iface("docker0", 2, "172.17.0.1/16")]
    assert names(ncclnet.choose(only, {})) == ["docker0"]
    assert names(ncclnet.choose(only[:1], {})) == ["lo"]
    one_char = ncclnet.choose(NODE, {"NCCL_SOCKET_IFNAME": "e"})
    assert one_char["source"] == "default" and "shorter than two characters" in one_char["ignored"]


def test_route_lookup_takes_the_longest_prefix_then_the_metric():
    routes = [{"dst": "default", "dev": "eth0", "metric": 100, "family": "inet"}, {"dst": "10.1.0.0/16", "dev": "eth1"},
              {"dst": "10.1.2.0/24", "dev": "eth2", "metric": 50}, {"dst": "10.1.2.0/24", "dev": "eth3", "metric": 10}]
    assert ncclnet.route_for(routes, "10.1.2.9")["dev"] == "eth3"
    assert ncclnet.route_for(routes, "10.1.9.9")["dev"] == "eth1"
    assert ncclnet.route_for(routes, "8.8.8.8")["dev"] == "eth0"
    assert ncclnet.route_for(routes, "fd00::1") is None


# -- NCCL_DEBUG=INFO output --------------------------------------------------------------------------------

INFO_LOG = """\
node1:2811:2811 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>
node1:2811:2811 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
node1:2811:2840 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth
node1:2811:2840 [0] NCCL INFO NET/IB : No device found.
node1:2811:2840 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0> [1]eth10:10.0.10.5<0>
node1:2811:2840 [0] NCCL INFO Using network Socket
node1:2811:2840 [0] NCCL WARN Net : Connect to 10.0.0.7<43211> failed : No route to host
"""


def test_nccl_info_lines_give_the_interface_and_transport_nccl_chose():
    log = nccllog.parse(INFO_LOG)
    assert log["bootstrap"] == {"ifname": "eth0", "address": "10.0.0.5"} and log["network"] == "Socket"
    assert [s["ifname"] for s in log["socket"]] == ["eth0", "eth10"] and log["ib_none"]
    assert log["ifname_env"] == "eth" and log["warns"] == ["Net : Connect to 10.0.0.7<43211> failed : No route to host"]
    ib = nccllog.parse("x NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB [RO]; OOB ens1f0:10.10.10.1<0>")
    assert ib["ib"] == [{"device": "mlx5_0", "port": 1, "link_layer": "RoCE"},
                        {"device": "mlx5_1", "port": 1, "link_layer": "IB"}]
    assert nccllog.chosen_interface(ib) == "ens1f0"


class _Host:
    def __init__(self, target: Target):
        self.target, self.info = target, {"kind": "live"}


def test_the_nccl_log_probe_reads_a_log_file(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1\n" + INFO_LOG)
    facts, _ = nccl_log_probe(_Host(Target.of(options={"train_log": str(log)})))
    assert facts["bootstrap"]["ifname"] == "eth0" and facts["sources"] == [f"--log {log}"]
    s = from_text(INFO_LOG, "log", "train.log")
    assert any(x.signature == "nccl.connect-failed" and x.fields["address"] == "10.0.0.7" for x in s)


# -- InfiniBand / RoCE from recorded trees -------------------------------------------------------------------


def ib_facts(tree: str, env: dict[str, str], log: str = "") -> Facts:
    load_vocabulary()
    ib = infiniband.read_devices(str(IB_TREES / tree))
    sym = [x.to_dict() for x in from_text(log, "log", "train.log")]
    return Facts({"infiniband": ProbeResult(probe="infiniband", facts=ib),
                  "nccl_net": ProbeResult(probe="nccl_net", facts={"env": env}),
                  "symptoms": ProbeResult(probe="symptoms", facts={"symptoms": sym})})


def test_the_roce_gid_table_is_read_as_show_gids_prints_it():
    ib = infiniband.read_devices(str(IB_TREES / "roce-connectx6"))
    (port,) = ib["devices"][0]["ports"]
    assert port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet" and port["gid_table_size"] == 8
    assert [(g["index"], g["type"], g["address"]) for g in port["gids"]] == [
        (0, "IB/RoCE v1", "fe80::ba59:9fff:fe1a:e3ea"), (1, "RoCE v2", "fe80::ba59:9fff:fe1a:e3ea"),
        (2, "IB/RoCE v1", "10.10.10.1"), (3, "RoCE v2", "10.10.10.1")]


COMPLETION = "node2:77:99 [3] NCCL WARN NET/IB : Got completion from peer 10.10.10.2<48122> with status=12 opcode=0"


def test_a_roce_v1_gid_index_is_flagged_and_explains_the_completion_error():
    (f,) = evaluate_check("nccl.ib", ib_facts("roce-connectx6", {"NCCL_IB_GID_INDEX": "2"}, COMPLETION))
    assert f.status == "warn" and "RoCE v1" in f.detail and f.explains == ["S1"]
    (rem,) = f.remedies
    assert rem.commands == ["export NCCL_IB_GID_INDEX=3"]
    (ok,) = evaluate_check("nccl.ib", ib_facts("roce-connectx6", {"NCCL_IB_GID_INDEX": "3"}, COMPLETION))
    assert ok.status == "ok" and ok.explains == []


def test_an_empty_or_link_local_gid_index():
    (f,) = evaluate_check("nccl.ib", ib_facts("roce-connectx6", {"NCCL_IB_GID_INDEX": "6"}))
    assert f.status == "fail" and "no entry 6" in f.detail
    (f,) = evaluate_check("nccl.ib", ib_facts("roce-connectx6", {"NCCL_IB_GID_INDEX": "1"}))
    assert f.status == "warn" and "link-local" in f.detail


def test_nccl_ib_hca_naming_no_device_and_a_port_down():
    (f,) = evaluate_check("nccl.ib", ib_facts("ib-hdr", {"NCCL_IB_HCA": "mlx4"}))
    assert f.status == "fail" and "names no device" in f.detail and "mlx5_0, mlx5_1" in f.detail
    (f,) = evaluate_check("nccl.ib", ib_facts("ib-hdr", {"NCCL_IB_HCA": "=mlx5_1"}))
    assert f.status == "fail" and "mlx5_1 port 1 is DOWN" in f.detail
    (f,) = evaluate_check("nccl.ib", ib_facts("ib-hdr", {"NCCL_IB_HCA": "^mlx5_1"}))
    assert f.status == "ok" and "mlx5_0:1 (InfiniBand, 200 Gb/sec (4X HDR))" in f.detail


def test_no_infiniband_here_is_not_examined():
    (f,) = evaluate_check("nccl.ib", ib_facts("no-such-tree", {}))
    assert f.id == "nccl.ib.not-checked" and f.status == "skip" and "not examined: no " in f.detail
    (f,) = evaluate_check("nccl.ib", ib_facts("no-such-tree", {"NCCL_NET": "IB"}))
    assert f.status == "fail" and "NCCL_NET=IB" in f.title


# -- real network namespaces -------------------------------------------------------------------------------

NS, PEER = f"h6nccl{os.getpid()}", f"h6peer{os.getpid()}"
SETUP = [
    # the node: a bridge with a veth port (the peer node on it), a second network, an interface with no
    # address, and one with an address whose link is down
    "ip netns add {ns}", "ip netns add {peer}", "ip -n {ns} link set lo up",
    "ip -n {ns} link add h6br0 type bridge", "ip -n {ns} addr add 10.66.1.1/24 dev h6br0",
    "ip -n {ns} link add h6v0 type veth peer name h6p0 netns {peer}", "ip -n {ns} link set h6v0 master h6br0",
    "ip -n {ns} link set h6v0 addrgenmode none",  # a port holds no address of its own (as a bond slave)
    "ip -n {ns} link add h6v1 type veth peer name h6p1 netns {peer}", "ip -n {ns} addr add 10.66.2.1/24 dev h6v1",
    "ip -n {ns} link add h6v2 type veth peer name h6p2 netns {peer}", "ip -n {ns} link set h6v2 addrgenmode none",
    "ip -n {ns} link add h6v3 type veth peer name h6p3 netns {peer}", "ip -n {ns} addr add 10.66.3.1/24 dev h6v3",
    "ip -n {ns} link set h6br0 up", "ip -n {ns} link set h6v0 up", "ip -n {ns} link set h6v1 up",
    "ip -n {ns} link set h6v2 up", "ip -n {ns} link add h6v5 type veth peer name h6p5 netns {peer}",
    "ip -n {ns} addr add 10.66.5.1/24 dev h6v5", "ip -n {ns} link set h6v5 up",  # its peer stays down
    "ip -n {peer} addr add 10.66.1.2/24 dev h6p0", "ip -n {peer} addr add 10.66.2.2/24 dev h6p1",
    "ip -n {peer} link set h6p0 up", "ip -n {peer} link set h6p1 up", "ip -n {peer} link set h6p2 up",
]

PROBE = textwrap.dedent("""
    import json, sys
    from zdoctor.layers import evaluate_check
    from zdoctor.host import LiveHost
    from zdoctor.core.model import ProbeResult
    from zdoctor.core.registry import Facts, load_vocabulary
    from zdoctor.symptoms.extract import from_text
    from zdoctor.proc.target import Target
    load_vocabulary()
    env, hostfile, log = json.loads(sys.argv[1])
    host = LiveHost(target=Target.of(env=env, options={"hostfile": hostfile}))
    facts = dict(host.results(["nccl_net"]).items())
    facts["symptoms"] = ProbeResult(probe="symptoms", facts={"symptoms": [s.to_dict() for s in from_text(log, "log")]})
    facts = Facts(facts)
    out = {"facts": facts["nccl_net"].facts, "findings": {}}
    for name in ("nccl.socket", "nccl.peers"):
        out["findings"][name] = [f.to_dict() for f in evaluate_check(name, facts)]
    print(json.dumps(out))
""")


def _sh(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd.split(), capture_output=True, text=True, timeout=20)


@pytest.fixture(scope="module")
def netns(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 (network namespaces)")
    try:
        for cmd in SETUP:
            r = _sh(cmd.format(ns=NS, peer=PEER))
            assert r.returncode == 0, (cmd, r.stderr)
        hf = tmp_path_factory.mktemp("hosts") / "hostfile"
        hf.write_text("10.66.1.2 slots=8\n10.66.2.2 slots=8\n")
        yield {"hostfile": str(hf)}
    finally:
        _sh(f"ip netns del {NS}")
        _sh(f"ip netns del {PEER}")


def in_ns(env: dict[str, str], hostfile: str | None = None, log: str = "") -> dict:
    r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", PROBE, json.dumps([env, hostfile, log])],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def one(doc: dict, name: str) -> dict:
    (f,) = doc["findings"][name]
    return f


def test_bridge_membership_and_the_interface_without_an_address(netns):
    doc = in_ns({"NCCL_SOCKET_IFNAME": "h6v2"}, log="n1:9:9 [0] NCCL WARN Bootstrap : no socket interface found")
    ifs = {i["ifname"]: i for i in doc["facts"]["interfaces"]}
    assert ifs["h6br0"]["kind"] == "bridge" and ifs["h6br0"]["bridge_ports"] == ["h6v0"]
    assert ifs["h6v0"]["master"] == "h6br0" and ifs["h6v2"]["addrs"] == []
    f = one(doc, "nccl.socket")
    assert f["status"] == "fail" and "h6v2, which has no IPv4 or IPv6 address" in f["detail"]
    assert f["explains"] == ["S1"]
    assert one(doc, "nccl.peers")["id"] == "nccl.peers.not-checked"
    assert "no hostfile or MASTER_ADDR given" in one(doc, "nccl.peers")["detail"]


def test_a_wrong_socket_ifname_gets_the_interface_the_route_uses(netns):
    doc = in_ns({"NCCL_SOCKET_IFNAME": "eth0", "MASTER_ADDR": "10.66.2.2"})
    f = one(doc, "nccl.socket")
    assert f["status"] == "fail" and "matches no interface of this node" in f["detail"]
    (rem,) = f["remedies"]
    assert rem["commands"] == ["export NCCL_SOCKET_IFNAME=h6v1"] and rem["undo"] == ["export NCCL_SOCKET_IFNAME=eth0"]


def test_a_bridge_port_selected_gets_its_bridge(netns):
    f = one(in_ns({"NCCL_SOCKET_IFNAME": "=h6v0"}), "nccl.socket")
    assert f["status"] == "fail" and "h6v0 is a port of h6br0, which holds the address" in f["detail"]
    assert f["remedies"][0]["commands"] == ["export NCCL_SOCKET_IFNAME=h6br0"]


def test_an_interface_whose_link_is_down(netns):
    f = one(in_ns({"NCCL_SOCKET_IFNAME": "h6v3"}), "nccl.socket")
    assert f["status"] == "fail" and "h6v3 is down" in f["detail"]
    f = one(in_ns({"NCCL_SOCKET_IFNAME": "h6v5"}), "nccl.socket")
    assert f["status"] == "fail" and "h6v5 has no carrier (state LOWERLAYERDOWN)" in f["detail"]


def test_a_hostfile_address_routed_through_another_interface(netns):
    log = "n1:1:1 [0] NCCL WARN Net : Connect to 10.66.2.2<41234> failed : No route to host"
    doc = in_ns({"NCCL_SOCKET_IFNAME": "h6br", "MASTER_ADDR": "10.66.1.2"}, netns["hostfile"], log)
    assert one(doc, "nccl.socket")["status"] == "ok" and "h6br0 (10.66.1.1" in one(doc, "nccl.socket")["title"]
    f = one(doc, "nccl.peers")
    assert f["status"] == "fail" and "10.66.2.2 (10.66.2.2): routed through h6v1, not h6br0" in f["detail"]
    table = f["evidence"][0]["table"]
    assert [r[0] for r in table["rows"]] == ["10.66.1.2", "10.66.2.2"] and table["highlight"] == [1]
    assert f["remedies"][0]["commands"] == ["export NCCL_SOCKET_IFNAME=h6v1"]
    assert f["explains"] == ["S1"]
    ok = in_ns({"NCCL_SOCKET_IFNAME": "h6br", "MASTER_ADDR": "10.66.1.2"})
    assert one(ok, "nccl.peers")["status"] == "ok"


def check_in_ns(tmp_path: Path, *args: str, **env_vars: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "MASTER_"))}
    r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "zdoctor", "check", "--json", "--no-log",
                        "--playbook", "multinode", *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**env, **env_vars, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path)})
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def test_check_with_a_hostfile_walks_to_the_route_that_leaves_through_another_interface(netns, tmp_path):
    doc = check_in_ns(tmp_path, "--hostfile", netns["hostfile"], NCCL_SOCKET_IFNAME="h6br", MASTER_ADDR="10.66.1.2")
    (walk,) = [p for p in doc["playbooks"] if p["id"] == "multinode"]
    assert walk["diagnosis"] == "diag-no-route"
    (f,) = [f for f in doc["findings"] if f["id"] == "nccl.peers"]
    assert f["status"] == "fail" and "routed through h6v1, not h6br0" in f["detail"]
    assert doc["exit_code"] == 1


def test_check_json_says_which_parts_of_the_layer_were_not_examined(netns, tmp_path):
    doc = check_in_ns(tmp_path)
    (layer,) = [x for x in doc["layers"] if x["id"] == "nccl-network"]
    assert layer["status"] == "partly examined" and layer["checks"] == ["nccl.memlock", "nccl.socket"]
    missed = {m["check"]: m["why"] for m in layer["not_examined"]}
    assert missed["nccl.peers"].startswith("not examined: no hostfile or MASTER_ADDR given")
    assert missed["nccl.ib"].startswith("not examined: no /sys/class/infiniband")


def socket_facts(interfaces: list[dict], env: dict[str, str], peers: list[dict]) -> Facts:
    load_vocabulary()
    nf = {"env": env, "interfaces": interfaces, "choice": ncclnet.choose(interfaces, env), "peers": peers}
    return Facts({"nccl_net": ProbeResult(probe="nccl_net", facts=nf)})


def test_loopback_or_a_link_local_address_in_a_multi_node_job():
    peer = [{"name": "10.9.0.2", "source": "MASTER_ADDR", "address": "10.9.0.2",
             "route": {"dev": "eth0", "type": None}}]
    lo_only = [iface("lo", 1, "127.0.0.1/8"), iface("eth0", 2, "fe80::5/64")]
    (f,) = evaluate_check("nccl.socket", socket_facts(lo_only, {"NCCL_SOCKET_IFNAME": "lo"}, peer))
    assert f.status == "fail" and "reachable only from this node" in f.detail
    assert f.remedies[0].commands == ["export NCCL_SOCKET_IFNAME=eth0"]
    (f,) = evaluate_check("nccl.socket", socket_facts(lo_only, {}, peer))  # the default order skips lo
    assert f.status == "warn" and "link-local fe80::5" in f.detail
    (f,) = evaluate_check("nccl.socket", socket_facts(lo_only, {"NCCL_SOCKET_IFNAME": "lo"}, []))
    assert f.status == "ok"  # one node: loopback is fine


def test_a_master_addr_that_reads_as_an_option_is_not_looked_up():
    from zdoctor.layers.nccl_network.probe_ncclnet import _resolve

    addr, why = _resolve("--help")
    assert addr is None and why.startswith("not a host name: starts with '-'")
    assert _resolve("10.1.2.3") == ("10.1.2.3", None)


def test_each_nodes_nccl_address_is_shown_and_not_judged_in_the_skew_table():
    from zdoctor.fleet.skew import read_facts, skew_table
    from zdoctor.report.reportdoc import fleet_tables

    def probes(name: str, addr: str, mtu: int) -> dict:
        interfaces = [iface(name, 2, addr)]
        interfaces[0]["mtu"] = mtu
        return {"nccl_net": {"env": {"NCCL_SOCKET_IFNAME": name}, "interfaces": interfaces,
                             "choice": ncclnet.choose(interfaces, {"NCCL_SOCKET_IFNAME": name})}}

    per_node = {"n1": read_facts(probes("eth0", "10.0.0.1/24", 9000)),
                "n2": read_facts(probes("eth0", "10.0.0.2/24", 1500))}
    rows = {r.fact.id: r for r in skew_table(per_node, ["n1", "n2"])}
    assert rows["nccl-interface"].values == {"n1": "eth0", "n2": "eth0"} and not rows["nccl-interface"].differs
    assert rows["nccl-address"].values == {"n1": "10.0.0.1/24", "n2": "10.0.0.2/24"}
    assert not rows["nccl-address"].differs and rows["nccl-mtu"].differs  # the MTU must agree, the address not
    (_, _, skew_rows, hot) = fleet_tables({"nodes": [], "skew": [r.to_dict() for r in rows.values()]})[1]
    shown = {row[0]: (n, row[2]) for n, row in enumerate(skew_rows)}
    n, text = shown["NCCL address"]
    assert text == "n1: 10.0.0.1/24; n2: 10.0.0.2/24" and n not in hot
    assert shown["MTU of NCCL's interface"][0] in hot


def test_the_glossary_explains_the_layers_terms():
    from zdoctor.core.glossary import find_term, load_glossary

    terms = load_glossary()
    for name in ("NCCL_SOCKET_IFNAME", "GID index"):
        t = find_term(terms, name)
        assert t is not None and all(find_term(terms, s) is not None for s in t.see)


def test_a_malformed_hostfile_is_the_reason_the_routes_were_not_examined(tmp_path):
    from zdoctor.layers.nccl_network.probe_ncclnet import _hostfile

    bad = tmp_path / "hostfile"
    bad.write_text("worker-1 slots=8\nbad host!\n")
    hf = _hostfile(str(bad))
    assert hf["hosts"] == [] and f"{bad}:2: expected 'slots=N'" in hf["error"]
    facts = socket_facts([iface("eth0", 2, "10.0.0.1/24")], {}, [])
    facts["nccl_net"].facts["hostfile"] = hf
    (f,) = evaluate_check("nccl.peers", facts)
    assert f.id == "nccl.peers.not-checked" and f.detail.startswith("the hostfile could not be read: ")
