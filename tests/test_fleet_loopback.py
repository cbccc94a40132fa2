"""`zdoctor fleet` against real launchers: an OpenSSH server on loopback addresses, pdsh with its ssh
module, and ssh itself. One node has an old libstdc++ on its LD_LIBRARY_PATH (set by sshd for that address
only), one has no zdoctor, one hangs, one address has nobody listening."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from envkit import build_extension, make_old_libstdcxx
from sshkit import node_bin, require, start_sshd

GOOD, CONDA, ALSO_GOOD, NO_ZDOCTOR, HUNG = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"
NOBODY = "127.0.0.9"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    require("/usr/sbin/sshd", "ssh", "pdsh")
    root = tmp_path_factory.mktemp("fleet")
    old = make_old_libstdcxx(root / "old").parent
    ext = build_extension(root / "exts", "needsnew")
    good = node_bin(root / "bin")
    hung = node_bin(root / "hung", body=f"echo $$ >> {root / 'hung.pids'}\nexec sleep 300\n")
    path = "/usr/local/bin:/usr/bin:/bin"
    sshd = start_sshd(root / "sshd", {
        GOOD: {"PATH": f"{good}:{path}"},
        CONDA: {"PATH": f"{good}:{path}", "LD_LIBRARY_PATH": str(old)},
        ALSO_GOOD: {"PATH": f"{good}:{path}"},
        NO_ZDOCTOR: {"PATH": path},
        HUNG: {"PATH": f"{hung}:{path}"},
    })
    yield {"sshd": sshd, "old": old, "ext": ext, "root": root}
    sshd.stop()


def hung_alive(root: Path) -> list[int]:
    """The hung nodes' processes (each wrote its pid before it became ``sleep 300``) still running."""
    import psutil

    pids = [int(x) for x in (root / "hung.pids").read_text().split()] if (root / "hung.pids").exists() else []
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def hostfile(tmp_path: Path, *lines: str) -> str:
    p = tmp_path / "hostfile"
    p.write_text("# the job's nodes\n\n" + "\n".join(lines) + "\n")
    return str(p)


def fleet_args(fleet, hf: str, launcher: str, *extra: str) -> list[str]:
    return ["fleet", "--hostfile", hf, "--launcher", launcher, "--ssh-config", str(fleet["sshd"].ssh_config),
            "--zdoctor", "zdoctor-node", *extra]


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize("launcher", ["pdsh", "ssh"])
def test_the_node_with_a_conda_libstdcxx_is_the_one_flagged(fleet, cli, tmp_path, launcher):
    hf = hostfile(tmp_path, f"{GOOD} slots=8", f"{CONDA} slots=8", f"{ALSO_GOOD} slots=8")
    r = cli(fleet_args(fleet, hf, launcher, "--ext", str(fleet["ext"]), "--json"))
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["launcher"] == launcher and doc["summary"]["reached"] == 3 and doc["source"] == hf
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert [n["launch"]["status"] for n in nodes.values()] == ["ok", "ok", "ok"]
    skew = by_id(doc["skew"])
    assert skew["ld-library-path"]["differing"] == [CONDA]
    assert skew["ld-library-path"]["values"][CONDA] == str(fleet["old"])
    assert skew["libstdcxx"]["differing"] == [CONDA]
    assert skew["libstdcxx"]["values"][CONDA].startswith(str(fleet["old"]))
    assert skew["python"]["differing"] == [] and skew["glibc"]["differing"] == []
    # the matrix: only the conda node fails the GLIBCXX check, and it names the missing version
    assert nodes[CONDA]["cells"]["libs.glibcxx"] == "fail"
    assert nodes[GOOD]["cells"]["libs.glibcxx"] == "ok" == nodes[ALSO_GOOD]["cells"]["libs.glibcxx"]
    bad = by_id(nodes[CONDA]["findings"])
    glibcxx = next(f for fid, f in bad.items() if fid.startswith("libs.glibcxx") and f["status"] == "fail")
    assert "GLIBCXX_3.4.30" in glibcxx["title"] + glibcxx["detail"]
    assert {f["id"] for f in doc["findings"]} >= {"fleet.skew.ld-library-path", "fleet.skew.libstdcxx"}
    assert nodes[CONDA]["status"] == "fail" and nodes[GOOD]["status"] != "fail"


@pytest.mark.parametrize("launcher", ["pdsh", "ssh"])
def test_unreachable_missing_and_hung_nodes_are_findings_within_the_timeout(fleet, cli, tmp_path, launcher):
    hf = hostfile(tmp_path, GOOD, NO_ZDOCTOR, HUNG, NOBODY)
    t0 = time.monotonic()
    # the limit leaves the good node's snapshot room on a loaded machine: the hung node is cut at it
    r = cli(fleet_args(fleet, hf, launcher, "--timeout", "15", "--json"))
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    nodes = {n["host"]: n for n in json.loads(r.stdout)["nodes"]}
    assert nodes[GOOD]["launch"]["status"] == "ok"
    assert nodes[NOBODY]["launch"]["status"] == "unreachable"
    assert "Connection refused" in nodes[NOBODY]["launch"]["error"]
    assert nodes[NO_ZDOCTOR]["launch"]["status"] == "no-zdoctor"
    assert nodes[NO_ZDOCTOR]["launch"]["error"] == ("timeout: failed to run command 'zdoctor-node': "
                                                    "No such file or directory")
    assert nodes[HUNG]["launch"]["status"] == "timeout"
    for host in (NOBODY, NO_ZDOCTOR, HUNG):
        (f,) = nodes[host]["findings"]
        assert f["status"] == "fail" and f["id"] == f"fleet.node.{nodes[host]['launch']['status']}"
    assert took < 15 + 20, took  # the hung node is cut at its timeout (pdsh checks it once a second or so)
    # killing ssh does not stop a command without a terminal on the node: its own `timeout` does
    assert (fleet["root"] / "hung.pids").exists()  # the hung node did start
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and hung_alive(fleet["root"]):
        time.sleep(0.2)
    assert hung_alive(fleet["root"]) == []


def test_report_session_replay_and_export(fleet, cli, tmp_path):
    hf = hostfile(tmp_path, f"{GOOD} slots=1", f"{CONDA} slots=1", NOBODY)
    r = cli(fleet_args(fleet, hf, "pdsh", "--ext", str(fleet["ext"])))
    assert r.returncode == 1, r.stderr
    out = r.stdout
    assert "3 nodes" in out and "2 reached" in out and "fleet is not ready" in out
    assert f"{CONDA}: {fleet['old']}" in out  # the skew table names the odd node and its value
    assert "Connection refused" in out
    replay = cli(["fleet", "--replay", "last", "--json"])
    assert replay.returncode == 1, replay.stderr
    doc = json.loads(replay.stdout)
    assert by_id(doc["skew"])["ld-library-path"]["differing"] == [CONDA]
    assert [n["launch"]["status"] for n in doc["nodes"]] == ["ok", "ok", "unreachable"]
    md = cli(["export", "--last", "--format", "md"])
    assert md.returncode == 0, md.stderr
    assert "## Fleet" in md.stdout and "Nodes x checks" in md.stdout
    assert f"| ⚠ | LD\\_LIBRARY\\_PATH | (none) | {CONDA}: " in md.stdout
    js = json.loads(cli(["export", "--last", "--format", "json"]).stdout)
    snaps = [e["node"]["snapshot"] for e in js["events"] if e["type"] == "fleet_node"]
    assert sum(s is not None for s in snaps) == 2  # the snapshots themselves are kept for a replay


def test_srun_runs_one_step_per_node_with_the_node_list(fleet, cli, tmp_path):
    """No Slurm here: a stand-in srun records its argv and runs the step's command on this machine."""
    fake = tmp_path / "slurm"
    fake.mkdir()
    log = tmp_path / "srun.log"
    (fake / "srun").write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {log}\n'
        'while [ "$1" != "--" ]; do shift; done; shift\n'
        'exec "$@"\n')
    (fake / "srun").chmod(0o755)
    import os
    env = dict(os.environ, PATH=f"{fake}:{fleet['root'] / 'bin'}:{os.environ['PATH']}",
               SLURM_JOB_NODELIST="node[01-02]")
    r = cli(["fleet", "--zdoctor", "zdoctor-node", "--json", "--python", "/usr/bin/python3"], env=env)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["launcher"] == "srun" and doc["source"] == "$SLURM_JOB_NODELIST"
    assert [n["launch"]["status"] for n in doc["nodes"]] == ["ok", "ok"]
    calls = sorted(log.read_text().splitlines())
    assert len(calls) == 2
    for host, call in zip(("node01", "node02"), calls):
        assert call.startswith(f"--nodes=1 --ntasks=1 --nodelist={host} --overlap --quiet")
        assert call.endswith("-- zdoctor-node snapshot -o - --armor --timeout 60 --python /usr/bin/python3 --nodes 2")


@pytest.mark.parametrize("launcher", ["pdsh", "ssh"])
def test_each_node_is_reported_as_it_finishes(fleet, launcher):
    """A node that answers is reported while a hung one is still running: pdsh's output is read as it comes."""
    from zdoctor.fleet.dispatch import collect
    from zdoctor.fleet.launch import FleetOptions

    t0 = time.monotonic()
    seen: list[tuple[str, str, float]] = []
    opts = FleetOptions(launcher=launcher, zdoctor="zdoctor-node", timeout=8,
                        ssh_config=str(fleet["sshd"].ssh_config))
    runs = collect([HUNG, GOOD], opts, on_node=lambda n: seen.append((n.host, n.status, time.monotonic() - t0)))
    assert [(h, s) for h, s, _ in seen] == [(GOOD, "ok"), (HUNG, "timeout")]
    assert seen[0][2] < 8 <= seen[1][2] + 1  # the good node came in before the hung one's limit
    assert [r.host for r in runs] == [HUNG, GOOD]  # results stay in hostfile order
    assert runs[1].duration_s < 8 and runs[1].snapshot is not None


def test_fleet_tui_in_a_real_terminal(fleet, tmp_path, state_home):
    """`zdoctor fleet --tui` over pdsh in tmux: nodes come in one by one, then the matrix; a node opens."""
    import shutil

    from test_tui_tmux import Tmux

    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    hf = hostfile(tmp_path, f"{GOOD} slots=1", f"{CONDA} slots=1", NOBODY)
    term = Tmux(tmp_path, state_home)
    try:
        term.start(fleet_args(fleet, hf, "pdsh", "--ext", str(fleet["ext"]), "--tui"), (120, 36),
                   "xterm-256color")
        term.wait("Enter opens a node", NOBODY, "LD_LIBRARY_PATH", timeout=90)
        term.send("Down", "Enter")  # the second node: the one with the old libstdc++
        term.wait("libs.glibcxx", "GLIBCXX_3.4.30")
        term.send("Escape", "q")
        assert term.wait_dead() in ("1", "")
    finally:
        term.close()
    from zdoctor.walk.session import list_sessions, load_events

    (info,) = list_sessions(state_home / "zdoctor")
    events = load_events(info.id, state_home / "zdoctor")
    assert [e["type"] for e in events].count("fleet_node") == 3
    assert events[-1]["type"] == "session_end" and events[-1]["exit_code"] == 1
