"""Peers that route but do not answer, on real network namespaces: a real sshd on one address, an address
where nothing listens (refused), one whose packets vanish (a static neighbour entry that no host owns: a
real timeout), one behind an ``unreachable`` route; the real ssh client and a real torch rank failing against
them; and this node's name resolving to 127.0.1.1 (a private /etc/hosts and host name in a private mount and
UTS namespace). zdoctor's TCP connects tell the states apart and explain the real messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dsenv import ensure
from launchkit import PROBE, probe_argument
from sshkit import start_sshd
from test_gpu_facts import facts_of

from zdoctor.layers.launch import check_peers as cp
from zdoctor.layers.launch.peers import tcp_reach
from zdoctor.symptoms.extract import from_text

ROOT = Path(__file__).resolve().parent.parent
NS, PEER = f"zdpeer{os.getpid()}", f"zdpeerb{os.getpid()}"
ALIVE, DROPPED, UNREACHABLE, BLACKHOLE = "10.79.0.1", "10.79.0.2", "10.81.0.5", "10.82.0.5"
SETUP = [
    "ip netns add {ns}", "ip netns add {peer}", "ip -n {ns} link set lo up",
    "ip -n {ns} link add zdpa type veth peer name zdpb netns {peer}", "ip -n {ns} addr add 10.79.0.1/24 dev zdpa",
    "ip -n {ns} link set zdpa up", "ip -n {peer} link set zdpb up",
    # frames for 10.79.0.2 go out to a MAC nobody has: the SYN vanishes, as behind a dropping firewall
    "ip -n {ns} neigh add 10.79.0.2 lladdr 02:00:00:00:00:99 dev zdpa nud permanent",
    "ip -n {ns} route add unreachable 10.81.0.0/16", "ip -n {ns} route add blackhole 10.82.0.0/16",
]
NAME = "zdoctor-node-a"



def _sh(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd.split(), capture_output=True, text=True, timeout=20)


def in_ns(*argv: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", NS, *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=kw.pop("cwd", ROOT), **kw)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs root, iproute2 and util-linux (network, mount and UTS namespaces)")
    python = ensure()
    work = tmp_path_factory.mktemp("peers")
    sshd = None
    try:
        for cmd in SETUP:
            r = _sh(cmd.format(ns=NS, peer=PEER))
            assert r.returncode == 0, (cmd, r.stderr)
        sshd = start_sshd(work / "sshd", {ALIVE: {}}, netns=NS)
        port = sshd.port
        (work / "hostfile").write_text(f"{ALIVE} slots=1\n127.0.0.1 slots=1\n{DROPPED} slots=1\n"
                                       f"{UNREACHABLE} slots=1\n")
        (work / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {NAME}\n")
        (work / "t.py").write_text("import datetime, torch.distributed as dist\n"
                                   "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=4))\n")
        # the real messages: ssh to each host (no user configuration read), a torch rank to rank 0's address
        said = {h: in_ns("ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-p",
                         str(port), h, "true").stderr for h in ("127.0.0.1", DROPPED, UNREACHABLE)}
        rank = in_ns(str(python), str(work / "t.py"), cwd=work, env={
            **os.environ, "MASTER_ADDR": ALIVE, "MASTER_PORT": "29531", "RANK": "1", "WORLD_SIZE": "2"})
        log = "\n".join([*said.values(), rank.stderr])
        command = f"deepspeed --ssh_port {port} -H {work / 'hostfile'} t.py"
        env = {"PATH": os.environ["PATH"], "MASTER_ADDR": ALIVE, "MASTER_PORT": "29531"}
        # zdoctor's probe in the same network namespace, under a host name that resolves to 127.0.1.1
        script = (f"mount --bind {work / 'hosts'} /etc/hosts && hostname {NAME} && "
                  f"exec {sys.executable} -c \"$0\" \"$1\"")
        arg = probe_argument(env, command, log, ["launch", "hostfile", "peers"], ["launcher.peers"])
        r = in_ns("unshare", "-m", "-u", "sh", "-c", script, PROBE, arg, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr
        yield {"doc": json.loads(r.stdout), "said": said, "rank": rank, "port": port}
    finally:
        if sshd is not None:
            sshd.stop()
        _sh(f"ip netns del {NS}")
        _sh(f"ip netns del {PEER}")


def test_the_real_clients_fail_as_users_see_them(lab):
    p = lab["port"]
    assert f"ssh: connect to host 127.0.0.1 port {p}: Connection refused" in lab["said"]["127.0.0.1"]
    assert f"ssh: connect to host {DROPPED} port {p}: Connection timed out" in lab["said"][DROPPED]
    assert f"ssh: connect to host {UNREACHABLE} port {p}: No route to host" in lab["said"][UNREACHABLE]
    assert f"The client socket has timed out after 4000ms while trying to connect to ({ALIVE}, 29531)" \
        in lab["rank"].stderr


def test_each_host_s_ssh_port_is_told_apart(lab):
    hosts = {h["host"]: h for h in lab["doc"]["facts"]["peers"]["hosts"]}
    assert hosts[ALIVE]["ssh"]["state"] == "connected" and hosts[ALIVE]["ssh"]["banner"].startswith("SSH-2.0-")
    assert hosts[ALIVE]["ssh_port_source"] == "the launch's --ssh_port"
    assert hosts["127.0.0.1"]["ssh"]["state"] == "refused"
    assert hosts[DROPPED]["ssh"]["state"] == "timed out"
    assert hosts[UNREACHABLE]["ssh"]["state"] == "unreachable"
    assert hosts[ALIVE]["rendezvous"]["state"] == "refused"  # rank 0's store is not running


def test_the_ssh_messages_and_the_rank_s_timeout_are_explained(lab):
    doc = lab["doc"]
    by_kind: dict[str, list[str]] = {}
    for s in doc["symptoms"]:
        by_kind.setdefault(s["kind"], []).append(s["id"])
    hosts_f, master_f, own = doc["findings"]["launcher.peers"]
    assert hosts_f["status"] == "fail" and sorted(hosts_f["explains"]) == sorted(by_kind["ssh-connect"])
    assert len(by_kind["ssh-connect"]) == 3 and "timed out" in hosts_f["title"]
    assert master_f["status"] == "fail" and master_f["explains"] == by_kind["rendezvous-connect"]
    assert f"{ALIVE}:29531 is refused" in master_f["title"]
    # the host name: loopback on a 4-node job, with the address this node sends from
    assert own["id"] == "launcher.peers.own-name" and own["status"] == "fail"
    assert NAME in own["title"] and "127.0.1.1" in own["title"]
    assert f"{ALIVE} {NAME}" in own["remedies"][0]["commands"][0]


def test_a_reset_and_a_blackhole_route():
    # a server that accepts and resets at once (SO_LINGER 0), the way a refusing proxy does
    import socket
    import struct
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def reset_one() -> None:
        conn, _ = srv.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    t = threading.Thread(target=reset_one)
    t.start()
    rec = tcp_reach("127.0.0.1", srv.getsockname()[1], banner=True)
    t.join()
    srv.close()
    assert rec["state"] == "reset"
    # a blackhole route answers the connect at once with EINVAL: not a timeout (said as an error)
    if os.geteuid() == 0 and shutil.which("ip"):
        ns = f"zdbh{os.getpid()}"
        try:
            assert _sh(f"ip netns add {ns}").returncode == 0
            _sh(f"ip -n {ns} link set lo up")
            _sh(f"ip -n {ns} route add blackhole {BLACKHOLE}/32")
            r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                                f"import json; from zdoctor.layers.launch.peers import tcp_reach; "
                                f"print(json.dumps(tcp_reach('{BLACKHOLE}', 22)))"],
                               capture_output=True, text=True, timeout=30, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
            rec = json.loads(r.stdout)
            assert rec["state"] == "error" and rec["error"] == "Invalid argument"
        finally:
            _sh(f"ip netns del {ns}")


def test_one_node_jobs_and_a_quiet_store_are_no_failures():
    pf = {"hosts": [], "nodes": 1, "master": {"address": "10.0.0.1", "port": 29500, "source": "MASTER_ADDR",
                                              "resolved": "10.0.0.1", "reach": {"state": "refused"}},
          "own_name": {"hostname": "n", "names": [{"name": "n", "addresses": ["127.0.1.1"], "loopback_only": True}]}}
    master, own = cp.check_peers(facts_of(peers=pf))
    assert master.status == "ok"
    assert own.status == "skip"
    (f,) = cp.check_peers(facts_of(peers={"skipped": "no hostfile"}))
    assert f.status == "skip"
    sy = {"symptoms": [s.to_dict() for s in from_text(
        "ssh: connect to host n2 port 22: Connection refused", "log")]}
    assert sy["symptoms"][0]["fields"] == {"host": "n2", "port": "22", "error": "Connection refused"}
