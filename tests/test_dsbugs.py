"""Known launcher bugs of specific DeepSpeed releases: the release tags' own launcher files
(fixtures/deepspeed-releases) read as installed packages, and laid over a copy of the real installed
DeepSpeed 0.19.8 so that the old launcher runs for real and fails as users saw it; zdoctor names the bug
from the installed files and the launch's own arguments, explains the message through the catalogue, and
the fixed release (the real 0.19.8) or the workaround gets past it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from dsenv import ensure
from test_gpu_facts import facts_of

from zdoctor.layers.launch.probe_launch import collect_hostfile, collect_launch
from zdoctor.layers.python_env import check_dsbugs as cb
from zdoctor.layers.python_env import dsbugs
from zdoctor.layers.python_env.probe_dsrelease import collect_dsrelease
from zdoctor.symptoms import links
from zdoctor.symptoms.extract import from_text

RELEASES = Path(__file__).parent / "fixtures" / "deepspeed-releases"
#: Two hosts no resolver answers for: pdsh's ssh fails on them at once, and no machine is reached.
HOSTFILE = "node-a.invalid slots=1\nnode-b.invalid slots=1\n"
SCRIPT = "import sys\nprint('ARGS', sys.argv[1:])\n"
#: The launcher run with its own logger at INFO, so that it prints the 'cmd = pdsh ...' line it runs.
LOUD = ("import logging, runpy, sys\nfrom deepspeed.utils import logger\nlogger.setLevel(logging.INFO)\n"
        "for h in logger.handlers:\n    h.setLevel(logging.INFO)\nsys.argv = ['deepspeed', *sys.argv[1:]]\n"
        "runpy.run_module('deepspeed.launcher.runner', run_name='__main__')\n")
#: Variables that would change what the launchers do, removed from the tests' launch environment.
LAUNCH_VARS = ("PDSH_SSH_ARGS_APPEND", *dsbugs.OMPI_RANK_VARS, "PYTHONPATH", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(scope="module")
def real():
    """The real environment's python and its installed deepspeed package dir."""
    python = ensure()
    where = "import importlib.util as u; print(u.find_spec('deepspeed').submodule_search_locations[0])"
    out = subprocess.run([str(python), "-c", where],
                         capture_output=True, text=True, timeout=300, check=True)
    return {"python": python, "deepspeed": Path(out.stdout.strip())}


def overlay(real: dict, dest: Path, release: str) -> Path:
    """The real installed DeepSpeed copied to ``dest/deepspeed`` with ``release``'s own files over it; the
    directory to put on PYTHONPATH."""
    shutil.copytree(real["deepspeed"], dest / "deepspeed", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(RELEASES / release, dest / "deepspeed", dirs_exist_ok=True)
    return dest


def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    (work / "hf").write_text(HOSTFILE)
    return work


def launch_env(path: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    env.update(extra)
    return env


def run_launcher(python: Path, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "deepspeed.launcher.runner", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def judge(python: Path, location: Path, version: str, command: str, env: dict[str, str], cwd: Path,
          stderr: str = "", hostfile: Path | None = None):
    """The check's findings for the install at ``location`` and the launch ``command``, the symptoms of
    ``stderr``, and which findings the catalogue's links say explain each symptom."""
    symptoms = from_text(stderr, "command", "--command") if stderr else []
    pyenv = {"deepspeed": {"installed": True, "version": version, "location": str(location)},
             "target": {"resolved": str(python)}}
    dsf, _ = collect_dsrelease(pyenv, {}, env=env, cwd=str(cwd))
    lf, _ = collect_launch(command, env, pyenv, cwd=str(cwd))
    hf = collect_hostfile(str(hostfile), "--hostfile", ssh=False)[0] if hostfile else {"skipped": "no hostfile"}
    found = cb.check_launch_bugs(facts_of(dsrelease=dsf, launch=lf, hostfile=hf,
                                          symptoms={"symptoms": [s.to_dict() for s in symptoms]}))
    explained = links.derive(symptoms, [links.Said(f.id, f.status, tuple(f.explains)) for f in found])
    return {f.id.rsplit(".", 1)[-1]: f for f in found}, symptoms, explained, dsf


def test_each_rule_names_its_commits_and_the_tags_files_agree_with_its_span():
    for bug in dsbugs.BUGS:
        assert bug["message"] and bug["affected"] and bug["workaround"]
        pr = bug["fixed_by"].split(" (")[0][len("DeepSpeed "):]
        assert f"tag v{bug['first_fixed']}" in bug["fixed_by"] and pr in " ".join(bug["sources"])
        assert any("commit" in s for s in bug["sources"]) and any(s.startswith("read from") for s in bug["sources"])
    expect = {("0.10.2", "user-args-resplit"): ("affected", ""), ("0.12.3", "user-args-resplit"): ("affected", "'"),
              ("0.12.4", "user-args-resplit"): ("affected", '"'),
              ("0.12.5", "user-args-resplit"): ("not-affected", None),
              ("0.14.0", "pdsh-ssh-port-keyerror"): ("affected", None),
              ("0.14.1", "pdsh-ssh-port-keyerror"): ("not-affected", None),
              ("0.18.3", "openmpi-env-check"): ("affected", None),
              ("0.18.4", "openmpi-env-check"): ("not-affected", None),
              ("0.14.0", "openmpi-env-check"): ("not-affected", None),
              ("0.6.1", "pdsh-export-unquoted"): ("not-affected", None),
              ("0.15.1", "pdsh-export-unquoted"): ("affected", None),
              ("0.15.2", "pdsh-export-unquoted"): ("not-affected", None)}
    for (release, bid), (state, quote) in expect.items():
        text = (RELEASES / release / dsbugs.BUGS_BY_ID[bid]["files"][0]).read_text()
        got = dsbugs.decide(bid, text)
        assert (got["state"], got.get("quote")) == (state, quote), (release, bid)
        by_tags = dsbugs.by_version(bid, tuple(int(p) for p in release.split(".")))
        assert (by_tags == "affected") == (state == "affected"), (release, bid)


def test_the_real_0198_has_none_of_them_read_from_its_own_files(real):
    bugs = dsbugs.installed_bugs(str(real["deepspeed"]), "0.19.8")
    assert {b: r["state"] for b, r in bugs.items()} == {b["id"]: "not-affected" for b in dsbugs.BUGS}
    assert all(r["how"] == "read from the installed file" and r["file"].startswith(str(real["deepspeed"]))
               for r in bugs.values())


def test_without_the_files_the_release_number_decides_and_without_both_it_is_unknown(tmp_path):
    by_number = dsbugs.installed_bugs(str(tmp_path / "gone"), "0.13.1")
    assert by_number["pdsh-ssh-port-keyerror"]["state"] == "affected"
    assert "release number 0.13.1" in by_number["pdsh-ssh-port-keyerror"]["how"]
    assert by_number["openmpi-env-check"]["state"] == "not-affected"
    assert {r["state"] for r in dsbugs.installed_bugs(str(tmp_path / "gone"), None).values()} == {"unknown"}


def test_an_apostrophe_in_a_script_argument_stops_the_0123_launcher_and_zdoctor_names_it(real, tmp_path):
    work = workdir(tmp_path)
    old = overlay(real, tmp_path / "old", "0.12.3")
    args = ["--num_gpus", "1", "train.py", "--prompt", "I'm a student"]
    failed = run_launcher(real["python"], args, work, launch_env(old))
    assert failed.returncode != 0 and "ValueError: No closing quotation" in failed.stderr
    assert "ARGS" not in failed.stdout
    command = "python -m deepspeed.launcher.runner --num_gpus 1 train.py --prompt \"I'm a student\""
    found, symptoms, explained, dsf = judge(real["python"], old / "deepspeed", "0.12.3", command, launch_env(old),
                                            work, failed.stderr)
    assert dsf["bugs"]["user-args-resplit"] == {**dsf["bugs"]["user-args-resplit"], "state": "affected",
                                                "quote": "'", "how": "read from the installed file"}
    f = found["user-args-resplit"]
    assert f.status == "fail" and "No closing quotation" in f.title and "I'm a student" in f.detail
    (sym,) = [s for s in symptoms if s.signature == "deepspeed.bug-user-args-resplit"]
    assert explained[sym.id] == [f.id]
    upgrade = f.remedies[0]
    assert upgrade.commands == [f"{real['python']} -m pip install --upgrade 'deepspeed>=0.12.5'"]
    # the fixed release (the real 0.19.8) hands the argument to the script as given
    fixed = run_launcher(real["python"], args, work, launch_env())
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "ARGS ['--local_rank=0', '--prompt', \"I'm a student\"]" in fixed.stdout


def test_the_same_release_without_a_quote_in_the_arguments_is_not_set_off(real, tmp_path):
    work = workdir(tmp_path)
    old = tmp_path / "old"
    shutil.copytree(RELEASES / "0.12.4", old / "deepspeed")
    command = "deepspeed --num_gpus 1 train.py --prompt \"I'm a student\""
    found, _, _, _ = judge(real["python"], old / "deepspeed", "0.12.4", command, launch_env(), work)
    assert found["user-args-resplit"].status == "ok"
    # 0.12.4 wraps in double quotes: an apostrophe passes, a double quote is what breaks it
    found, _, _, _ = judge(real["python"], old / "deepspeed", "0.12.4",
                           "deepspeed --num_gpus 1 train.py --prompt 'say \"hi'", launch_env(), work)
    assert found["user-args-resplit"].status == "fail"
    assert "No closing quotation" in found["user-args-resplit"].detail


def explained_failure(real, tmp_path, release: str, args: list[str], error: str, bug: str, signature: str):
    """The ``release`` launcher run for real with ``args`` fails with ``error``, and zdoctor's finding of
    ``bug`` fails and explains that message (catalogued as ``signature``): (work dir, the old release laid
    over the real one, the launch command, the finding)."""
    work = workdir(tmp_path)
    old = overlay(real, tmp_path / "old", release)
    failed = run_launcher(real["python"], args, work, launch_env(old))
    assert failed.returncode != 0 and error in failed.stderr
    command = "deepspeed " + " ".join(args)
    found, symptoms, explained, _ = judge(real["python"], old / "deepspeed", release, command, launch_env(old),
                                          work, failed.stderr, hostfile=work / "hf")
    f = found[bug]
    (sym,) = [s for s in symptoms if s.signature == signature]
    assert f.status == "fail" and explained[sym.id] == [f.id]
    return work, old, command, f


def test_ssh_port_without_pdsh_ssh_args_append_stops_the_0140_launcher(real, tmp_path):
    args = ["--hostfile", "hf", "--no_ssh_check", "--master_addr", "127.0.0.1", "--ssh_port", "2222", "train.py"]
    work, old, command, f = explained_failure(real, tmp_path, "0.14.0", args, "KeyError: 'PDSH_SSH_ARGS_APPEND'",
                                              "pdsh-ssh-port-keyerror", "deepspeed.bug-pdsh-ssh-port")
    assert "--ssh_port 2222" in f.detail and "0.11.0" in f.detail
    upgrade, workaround = f.remedies
    assert upgrade.commands == [f"{real['python']} -m pip install --upgrade 'deepspeed>=0.14.1'"]
    assert workaround.commands == ["export PDSH_SSH_ARGS_APPEND=''", command]
    # the workaround on the affected release, and the fixed release without it: both get past the
    # launcher to pdsh, whose ssh then fails on the unresolvable hosts
    for env in (launch_env(old, PDSH_SSH_ARGS_APPEND=""), launch_env()):
        went_on = run_launcher(real["python"], args, work, env)
        assert "KeyError" not in went_on.stderr and "node-a.invalid" in went_on.stdout + went_on.stderr
    # the variable set in the launch's environment: the bug is there but this launch does not set it off
    found, _, _, _ = judge(real["python"], old / "deepspeed", "0.14.0", command,
                           launch_env(PDSH_SSH_ARGS_APPEND="-o StrictHostKeyChecking=no"), work,
                           hostfile=work / "hf")
    assert found["pdsh-ssh-port-keyerror"].status == "ok"
    assert "PDSH_SSH_ARGS_APPEND is set" in found["pdsh-ssh-port-keyerror"].detail


def test_the_0183_openmpi_runner_demands_what_mpirun_sets(real, tmp_path):
    args = ["--hostfile", "hf", "--no_ssh_check", "--master_addr", "127.0.0.1", "--launcher", "openmpi", "train.py"]
    work, old, _, f = explained_failure(real, tmp_path, "0.18.3", args,
                                        "OSError: MPI environment variables are not set",
                                        "openmpi-env-check", "deepspeed.bug-openmpi-env-check")
    assert "OMPI_COMM_WORLD_LOCAL_RANK" in f.detail
    assert f.remedies[0].commands == [f"{real['python']} -m pip install --upgrade 'deepspeed>=0.18.4'"]
    # the fixed release goes past the check to its next need, Open MPI itself (absent here)
    fixed = run_launcher(real["python"], args, work, launch_env())
    assert "MPI environment variables" not in fixed.stderr and "launcher 'openmpi' not installed" in fixed.stderr
    # a single-node launch never builds the openmpi runner
    (work / "one").write_text("localhost slots=1\n")
    found, _, _, _ = judge(real["python"], old / "deepspeed", "0.18.3",
                           "deepspeed --hostfile one --launcher openmpi train.py", launch_env(), work,
                           hostfile=work / "one")
    assert found["openmpi-env-check"].status == "ok"


def test_the_message_with_a_fixed_install_points_at_another_launcher(real, tmp_path):
    work = workdir(tmp_path)
    found, symptoms, explained, _ = judge(real["python"], real["deepspeed"], "0.19.8", "deepspeed train.py",
                                          launch_env(), work,
                                          "Traceback (most recent call last):\nKeyError: 'PDSH_SSH_ARGS_APPEND'\n")
    f = found["pdsh-ssh-port-keyerror"]
    assert f.status == "warn" and "another install" in f.title
    assert explained[symptoms[0].id] == [f.id]
    # a message other programs print too is not pinned on another launcher
    found, symptoms, explained, _ = judge(real["python"], real["deepspeed"], "0.19.8", "deepspeed train.py",
                                          launch_env(), work, "ValueError: No closing quotation\n")
    f = found["user-args-resplit"]
    assert f.status == "warn" and "if the deepspeed launcher printed it" in f.title and "shlex.split" in f.detail
    assert explained[symptoms[0].id] == [f.id] and "pdsh-ssh-port-keyerror" not in found


def test_an_unreadable_release_names_the_bug_from_the_message_only(real, tmp_path):
    work = workdir(tmp_path)
    found, symptoms, explained, dsf = judge(
        real["python"], tmp_path / "gone", "", "deepspeed train.py", launch_env(), work,
        "OSError: MPI environment variables are not set. Ensure you are running the script with an "
        "MPI-compatible launcher.\n")
    assert dsf["bugs"]["openmpi-env-check"]["state"] == "unknown"
    f = found["openmpi-env-check"]
    assert f.status == "warn" and "from the message only" in f.title and "pip show deepspeed" in f.detail
    assert explained[symptoms[0].id] == [f.id]


def test_zdoctor_check_explains_the_real_keyerror_of_the_failing_launch(real, tmp_path):
    work = workdir(tmp_path)
    old = overlay(real, tmp_path / "old", "0.14.0")
    python = real["python"]
    command = f"{python} -m deepspeed.launcher.runner --hostfile hf --no_ssh_check --master_addr 127.0.0.1 " \
              "--ssh_port 2222 train.py"
    env = launch_env(Path(f"{old}{os.pathsep}{REPO}"))
    proc = run_cli(["check", "--json", "--no-log", "--python", str(python), "--command", command], env=env,
                   cwd=str(work), timeout=900)
    doc = json.loads(proc.stdout)
    f = next(x for x in doc["findings"] if x["id"] == "pyenv.deepspeed-launch-bug.pdsh-ssh-port-keyerror")
    assert f["status"] == "fail" and "multinode_runner.py" in f["detail"]
    # the copy carries 0.19.8's version number over 0.14.0's launcher: the files decide, and it says so
    assert "files were changed or mixed after the install" in f["detail"]
    (sym,) = [s for s in doc["symptoms"] if s["text"].startswith("KeyError: 'PDSH_SSH_ARGS_APPEND'")]
    assert sym["explained_by"] == [f["id"]] and sym["id"] in f["explains"]


def remote_command(python: Path, loud: Path, args: list[str], cwd: Path, env: dict[str, str]) -> str:
    """What the launcher hands pdsh to run on every node: its logged 'cmd = pdsh ... -w HOSTS REMOTE' line."""
    ran = subprocess.run([str(python), str(loud), *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    (line,) = [x for x in ran.stderr.splitlines() + ran.stdout.splitlines() if "cmd = pdsh" in x][:1]
    return line.split(" -w node-a.invalid,node-b.invalid ", 1)[1]


def test_an_exported_value_with_shell_syntax_breaks_the_0151_pdsh_command(real, tmp_path):
    work = workdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (work / ".deepspeed_env").write_text("SLURM_JOB_CPUS_PER_NODE=64(x2)\n")
    (tmp_path / "loud").mkdir()
    loud = tmp_path / "loud" / "loud.py"
    loud.write_text(LOUD)
    old = overlay(real, tmp_path / "old", "0.15.1")
    args = ["--hostfile", "hf", "--no_ssh_check", "--master_addr", "127.0.0.1", "train.py"]
    remote = remote_command(real["python"], loud, args, work, launch_env(old, HOME=str(home)))
    assert "export SLURM_JOB_CPUS_PER_NODE=64(x2);" in remote
    # what sshd runs on each node: the node's bash parses the command (-n: without running it)
    parsed = subprocess.run(["bash", "-n", "-c", remote], capture_output=True, text=True, timeout=60)
    assert parsed.returncode != 0 and "syntax error near unexpected token `('" in parsed.stderr
    stderr = "".join(f"node-a: {x}\n" for x in parsed.stderr.splitlines())
    command = "deepspeed " + " ".join(args)
    found, symptoms, explained, dsf = judge(real["python"], old / "deepspeed", "0.15.1", command,
                                            launch_env(HOME=str(home)), work, stderr, hostfile=work / "hf")
    assert {"name": "SLURM_JOB_CPUS_PER_NODE", "source": f"{work / '.deepspeed_env'} line 1", "chars": "()",
            "launch_dir": False} in dsf["exports"]
    f = found["pdsh-export-unquoted"]
    assert f.status == "fail" and "SLURM_JOB_CPUS_PER_NODE" in f.detail
    assert f.remedies[0].commands == [f"{real['python']} -m pip install --upgrade 'deepspeed>=0.15.2'"]
    (sym,) = [s for s in symptoms if s.signature == "deepspeed.bug-pdsh-export-unquoted"]
    assert explained[sym.id] == [f.id]
    # the fixed release (the real 0.19.8) quotes the value, and the same command parses
    fixed = remote_command(real["python"], loud, args, work, launch_env(HOME=str(home)))
    assert 'export SLURM_JOB_CPUS_PER_NODE="64(x2)";' in fixed
    assert subprocess.run(["bash", "-n", "-c", fixed], capture_output=True, timeout=60).returncode == 0
    # a launch directory with such characters: every release writes its 'cd' unquoted, so that comes first
    odd = tmp_path / "run (2)"
    shutil.copytree(work, odd)
    (odd / ".deepspeed_env").unlink()
    found, _, _, dsf = judge(real["python"], old / "deepspeed", "0.15.1", command, launch_env(HOME=str(home)),
                             odd, hostfile=odd / "hf")
    f = found["pdsh-export-unquoted"]
    assert f.status == "fail" and f.remedies[0].title.startswith("Launch from a directory")
    assert "upgrading alone does not get past it" in f.detail
    still = remote_command(real["python"], loud, args, odd, launch_env(HOME=str(home)))
    assert subprocess.run(["bash", "-n", "-c", still], capture_output=True, timeout=60).returncode != 0
