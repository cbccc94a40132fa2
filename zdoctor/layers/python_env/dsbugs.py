"""Launcher bugs of specific DeepSpeed releases, as data with their sources, how to tell from the installed
package's own files whether it has each one, and whether a launch's own arguments and environment set it off.

Each rule was read from the DeepSpeed repository: the commit that brought the bug, the commit that fixed it,
and the file of every release tag between (``first_bad`` is the first tag whose file has the buggy code,
``first_fixed`` the first with the fix). The installed file decides (``affected`` or ``not-affected``); only
when it cannot be read does the release number fall back on those tags, and "unknown" is said where neither
decides. The tags' files agree with the spans here: tests/fixtures/deepspeed-releases holds the ones the tests read.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from zdoctor.layers.python_env.dsrules import parse_version, read_source
from zdoctor.proc.userfile import open_regular

#: The launch variables the ``openmpi`` rule reads (mpirun sets them for the processes it starts).
OMPI_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
#: The variables the pdsh launcher exports to every node: those whose names start with these (runner.py
#: EXPORT_ENVS, and the CUDA accelerator's export_envs 'NCCL'), and each NAME=VALUE line of .deepspeed_env.
EXPORTED_PREFIXES = ("NCCL", "PYTHON", "MV2", "UCX", "MLFLOW")
#: Characters of a value that the remote shell reads as more than a word (DeepSpeed's own test since PR 7071).
SHELL_SPECIAL = re.compile(r"[^\w@%+=:,./-]")
#: Where the launcher reads .deepspeed_env (its name from DS_ENV_FILE): the home directory, then the launch's.
ENV_FILE_DEFAULT = ".deepspeed_env"
ENV_FILE_CAP = 256 * 1024

BUGS: list[dict[str, Any]] = [
    {"id": "user-args-resplit",
     "about": "the deepspeed launcher joins the training script's arguments and splits them again with "
              "shlex.split (runner.py main)",
     "message": "ValueError: No closing quotation",
     "others_print_it": "any Python program's shlex.split",
     "affected": "an argument with an unpaired quote character stops the launcher with \"ValueError: No "
                 "closing quotation\" before any rank starts; paired ones are silently dropped or merged. "
                 "0.10.1 and 0.10.2 join every argument bare (a quote or a space in one breaks it); 0.10.3 "
                 "to 0.12.3 wrap each in '...' (an apostrophe breaks it: --prompt \"I'm a student\"); 0.12.4 "
                 "wraps each in \"...\" (a double quote breaks it)",
     "fixed": "the arguments go to the ranks as given, without being split again",
     "first_bad": "0.10.1", "first_fixed": "0.12.5",
     "fixed_by": "DeepSpeed PR 4824 (commit d37fc25d5, tag v0.12.5)",
     "remedy": "upgrade",
     "workaround": "keep quote characters out of the training script's arguments (read such a value from a "
                   "file or an environment variable the script reads)",
     "sources": ["DeepSpeed PR 4007 'Fix user arg parsing in single node deployment' (commit 0cc2d6ff2, "
                 "first in tag v0.10.1): args.user_args = shlex.split(\" \".join(args.user_args))",
                 "DeepSpeed PR 4265 'fix user args parsing of string with spaces on runner' (commit e75c285ad, "
                 "first in tag v0.10.3): each argument wrapped in '...'",
                 "DeepSpeed PR 4660 'Fix for when prompt contains an odd num of apostrophes' (commit 00e7dc5e5, "
                 "first in tag v0.12.4): wrapped in \"...\" instead",
                 "DeepSpeed PR 4824 'Refactor launcher user arg parsing' (commit d37fc25d5, first in tag "
                 "v0.12.5): no shlex.split of the arguments",
                 "read from deepspeed/launcher/runner.py of tags v0.10.0, v0.10.1, v0.10.2, v0.10.3, v0.12.3, v0.12.4, "
                 "v0.12.5"],
     "files": ("launcher/runner.py",)},
    {"id": "pdsh-ssh-port-keyerror",
     "about": "deepspeed --ssh_port with the pdsh launcher (multinode_runner.py PDSHRunner.get_cmd)",
     "message": "KeyError: 'PDSH_SSH_ARGS_APPEND'",
     "affected": "the launcher appends \" -p PORT\" to PDSH_SSH_ARGS_APPEND with +=, so when the variable is not "
                 "set in the launching environment it stops with \"KeyError: 'PDSH_SSH_ARGS_APPEND'\" before pdsh "
                 "runs",
     "fixed": "a missing PDSH_SSH_ARGS_APPEND is read as empty",
     "first_bad": "0.11.0", "first_fixed": "0.14.1",
     "fixed_by": "DeepSpeed PR 5318 (commit cc897ecf1, tag v0.14.1)",
     "remedy": "upgrade",
     "workaround": "set PDSH_SSH_ARGS_APPEND (empty is enough) in the environment the launcher starts from",
     "sources": ["DeepSpeed PR 4373 'Fix multinode runner to properly append to PDSH_SSH_ARGS_APPEND' (commit "
                 "17957728c, first in tag v0.11.0): environment[\"PDSH_SSH_ARGS_APPEND\"] += ...",
                 "DeepSpeed PR 5318 'resolve KeyError: 'PDSH_SSH_ARGS_APPEND'' (commit cc897ecf1, first in tag "
                 "v0.14.1): environment.get('PDSH_SSH_ARGS_APPEND', '')",
                 "read from deepspeed/launcher/multinode_runner.py of tags v0.10.3, v0.11.0, v0.14.0, v0.14.1"],
     "files": ("launcher/multinode_runner.py",)},
    {"id": "openmpi-env-check",
     "about": "deepspeed --launcher openmpi on several nodes (multinode_runner.py OpenMPIRunner.validate_args)",
     "message": "MPI environment variables are not set. Ensure you are running the script with an "
                "MPI-compatible launcher.",
     "affected": "the launcher itself demands OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_RANK and "
                 "OMPI_COMM_WORLD_SIZE before it runs mpirun, which is what sets them: every openmpi launch "
                 "from a plain shell stops with OSError \"MPI environment variables are not set\"",
     "fixed": "the check is gone: mpirun sets those variables for the ranks",
     "first_bad": "0.16.4", "first_fixed": "0.18.4",
     "fixed_by": "DeepSpeed PR 7751 (commit 4809072a3, tag v0.18.4)",
     "remedy": "upgrade",
     "workaround": "run mpirun yourself (deepspeed's ranks read OMPI_COMM_WORLD_* under mpirun), or use the "
                   "default pdsh launcher",
     "sources": ["DeepSpeed PR 6979 'Fix setup_env_ranks to Properly Set Environment Variables Instead of "
                 "Raising Error' (commit 065ca8a61, first in tag v0.16.4): OpenMPIRunner.validate_args calls "
                 "_setup_mpi_environment",
                 "DeepSpeed issue 7711 and PR 7751 'remove premature MPI environment variable check in "
                 "OpenMPIRunner' (commit 4809072a3, first in tag v0.18.4)",
                 "read from deepspeed/launcher/multinode_runner.py of tags v0.16.3, v0.16.4, v0.18.3, v0.18.4"],
     "files": ("launcher/multinode_runner.py",)},
    {"id": "pdsh-export-unquoted",
     "about": "the variables the pdsh launcher exports to every node (multinode_runner.py add_export)",
     "message": "bash: -c: line N: syntax error near unexpected token",
     "others_print_it": "any command line bash is given to run",
     "affected": "each exported value goes into the remote command unquoted ('export NAME=VALUE; ...'), so a "
                 "value with a character the remote bash reads as syntax (SLURM_JOB_CPUS_PER_NODE=64(x2) in "
                 ".deepspeed_env, a PYTHONPATH entry with a parenthesis or a quote) makes every node answer "
                 "\"bash: -c: line 0: syntax error near unexpected token\" and no rank starts",
     "fixed": "a value with such characters is exported in double quotes",
     "first_bad": "0.1.0", "first_fixed": "0.15.2",
     "not_affected_between": ("0.5.10", "0.6.2"),
     "fixed_by": "DeepSpeed PR 5878 (commit fc22d9602, tag v0.15.2)",
     "remedy": "upgrade",
     "workaround": "keep shell syntax characters out of the exported values (the lines of .deepspeed_env and the "
                   "NCCL*, PYTHON*, UCX*, MV2*, MLFLOW* variables of the launching shell)",
     "sources": ["tags v0.1.0 and v0.2.0 deepspeed/pt/deepspeed_run.py main: exports += \"export {}={}; \" "
                 "with the value as given",
                 "DeepSpeed commit e5bbc2e55 (PR 343, first in tag v0.3.0): MultiNodeRunner.add_export stores "
                 "var.strip() as given",
                 "DeepSpeed PR 1690 (commit fead387f7, first in tag v0.5.10): PDSHRunner.get_cmd quotes each value "
                 "(export {key}={quote(val)}); PR 1907 'fix launcher for reading env vars' (commit 4575b2b79, first "
                 "in tag v0.6.2) takes the quoting out again",
                 "DeepSpeed PR 5878 'fix environment variable export bug for MultiNodeRunner' (commit fc22d9602, "
                 "first in tag v0.15.2): the value wrapped in double quotes",
                 "DeepSpeed PR 7071 'Conditionally quote env vars' (commit 591d4d4d5): quoted only when it has "
                 "characters outside [\\w@%+=:,./-]",
                 "read from deepspeed/launcher/multinode_runner.py of tags v0.3.0, v0.5.10, v0.6.1, v0.6.2, v0.15.1, "
                 "v0.15.2, v0.16.5"],
     "files": ("launcher/multinode_runner.py",)},
]

BUGS_BY_ID = {b["id"]: b for b in BUGS}

#: The buggy re-split of each era of runner.py, and the quote it wraps each argument in.
_RESPLIT = {
    'shlex.split(" ".join(args.user_args))': "",
    "else f\"'{x}'\"": "'",
    "else f'\"{x}\"'": '"',
}


@dataclass(frozen=True)
class Markers:
    """How a release's file shows a bug: the code it must hold to be judged at all (else unknown, and why),
    the buggy code (every marker of one of the ``buggy`` groups), and the fix's code (none of ``fixed``)."""

    judged: tuple[str, ...]
    unknown_why: str
    buggy: tuple[tuple[str, ...], ...]
    fixed: tuple[str, ...] = ()


#: The markers of the bugs whose file says yes or no alone (user-args-resplit also reads which quote).
MARKERS = {
    "pdsh-ssh-port-keyerror": Markers(("class PDSHRunner",), "no PDSHRunner in multinode_runner.py",
                                      (('environment["PDSH_SSH_ARGS_APPEND"] +=',),
                                       ("environment['PDSH_SSH_ARGS_APPEND'] +=",))),
    "openmpi-env-check": Markers(("class OpenMPIRunner",), "no OpenMPIRunner in multinode_runner.py",
                                 (("self._setup_mpi_environment()", "MPI environment variables are not set"),)),
    # before 0.3.0 the launcher had no multinode_runner.py: by the tags
    "pdsh-export-unquoted": Markers(("def add_export",), "no add_export in multinode_runner.py",
                                    (("self.exports[key.strip()] = var.strip()",),), fixed=("={quote(val)}",)),
}


def decide(bug_id: str, text: str) -> dict[str, Any]:
    """Whether the source ``text`` of the bug's file has it: ``state`` affected | not-affected | unknown."""
    if bug_id == "user-args-resplit":
        if "def main(" not in text or "user_args" not in text:
            return {"state": "unknown", "why": "no main() reading user_args in runner.py"}
        for code, quote in _RESPLIT.items():
            if code in text:
                return {"state": "affected", "quote": quote}
        if "args.user_args = shlex" in text:
            return {"state": "unknown", "why": "runner.py splits user_args in a way zdoctor does not know"}
        return {"state": "not-affected"}
    m = MARKERS[bug_id]
    if not all(code in text for code in m.judged):
        return {"state": "unknown", "why": m.unknown_why}
    buggy = any(all(code in text for code in group) for group in m.buggy)
    return {"state": "affected" if buggy and not any(code in text for code in m.fixed) else "not-affected"}


def by_version(bug_id: str, version: tuple[int, ...]) -> str:
    """Where ``version`` lies against upstream's release tags: before | affected | fixed (``fixed`` too in a
    rule's ``not_affected_between`` span, where a release had the fix and a later one took it out)."""
    bug = BUGS_BY_ID[bug_id]
    first_bad = parse_version(bug["first_bad"]) or ()
    first_fixed = parse_version(bug["first_fixed"]) or ()
    gap = [parse_version(v) or () for v in bug.get("not_affected_between") or ()]
    if gap and gap[0] <= version < gap[1]:
        return "fixed"
    return "before" if version < first_bad else "affected" if version < first_fixed else "fixed"


def installed_bugs(location: str | None, version: str | None) -> dict[str, dict[str, Any]]:
    """Per bug: whether the installed release has it (``state``), read from its own file (``how``), else
    from its release number by the tags; ``unknown`` when neither can say. ``era`` (before | affected |
    fixed) is where the release number lies against the tags, when it is known."""
    ver = parse_version(version)
    out: dict[str, dict[str, Any]] = {}
    for bug in BUGS:
        rec: dict[str, Any] = {"state": "unknown", "file": None, "how": None,
                               "era": by_version(bug["id"], ver) if ver is not None else None}
        if location:
            path, text, err = read_source(location, bug["files"])
            if text is not None:
                rec.update(decide(bug["id"], text), file=path, how="read from the installed file")
            else:
                rec["why"] = err
        else:
            rec["why"] = "DeepSpeed's location is unknown"
        if rec["state"] == "unknown" and rec["era"] is not None:
            rec.update(state="affected" if rec["era"] == "affected" else "not-affected",
                       how=f"from the release number {version} (the upstream tags)")
        out[bug["id"]] = rec
    return out


def resplit(args: list[str], quote: str) -> list[str]:
    """What an affected runner.py makes of the script's arguments ``args`` (its own join and shlex.split,
    each argument not starting with '-' wrapped in ``quote``); raises ValueError as it does."""
    return shlex.split(" ".join(a if a.startswith("-") or not quote else f"{quote}{a}{quote}" for a in args))


def exported_with_syntax(env: Mapping[str, str], cwd: str) -> list[dict[str, Any]]:
    """The variables the pdsh launcher would export from ``env`` and the .deepspeed_env files, whose values hold
    characters the remote shell reads as syntax: ``[{name, source, chars, launch_dir}]`` (never the values
    themselves). PYTHONPATH is exported with the launch directory put in front, as the launcher does
    (``launch_dir``: the characters are the directory's, which every release read also writes unquoted into
    the remote command's ``cd``)."""
    out: list[dict[str, Any]] = []

    in_dir = bool(SHELL_SPECIAL.search(cwd))

    def add(name: str, value: str, source: str) -> None:
        chars = sorted(set(SHELL_SPECIAL.findall(value.strip())))
        if chars:
            out.append({"name": name, "source": source, "chars": "".join(chars),
                        "launch_dir": in_dir and name == "PYTHONPATH" and "launch directory" in source})

    for name in sorted(env):
        if name.startswith(EXPORTED_PREFIXES):
            value = f"{cwd}:{env[name]}" if name == "PYTHONPATH" else env[name]
            add(name, value, "the launching environment" + (" (with the launch directory in front)"
                                                            if name == "PYTHONPATH" else ""))
    if "PYTHONPATH" not in env:
        add("PYTHONPATH", cwd, "the launch directory the launcher exports as PYTHONPATH")
    name = env.get("DS_ENV_FILE") or ENV_FILE_DEFAULT
    for folder in (env.get("HOME") or "", cwd):
        path = os.path.join(folder, name) if folder else ""
        if not path or not os.path.isfile(path):
            continue
        try:
            with open_regular(path) as fh:
                lines = fh.read(ENV_FILE_CAP).decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            key, eq, value = line.partition("=")
            if eq and key.strip():
                add(key.strip(), value, f"{path} line {number}")
    return out


def _multi_node(options: dict[str, Any], hosts: int | None) -> bool | None:
    """Whether the deepspeed launcher runs a multi-node launch (a runner of multinode_runner.py): with
    --force_multi, or more than one host in its hostfile unless --num_nodes 1; None when the hosts are unknown."""
    if options.get("force_multi"):
        return True
    if hosts is None:
        return None
    return hosts > 1 and str(options.get("num_nodes") or "") != "1"


def launch_sets_off(bug_id: str, rec: Mapping[str, Any], launch: Mapping[str, Any] | None, env: Mapping[str, Any],
                    hosts: int | None, exports: list[dict[str, Any]] | None = None) -> tuple[bool | None, str]:
    """Whether the launch (``launch``: :func:`zdoctor.layers.launch.command.parse_launch`'s record, ``env``:
    the environment it starts with, ``hosts``: its hostfile's host count, ``exports``:
    :func:`exported_with_syntax`) sets off ``bug_id`` of the installed release ``rec``, and why; None when it
    cannot be told."""
    if not launch or not launch.get("launcher"):
        return None, "zdoctor was not given the launch command (--command)"
    if launch.get("launcher") != "deepspeed":
        return False, f"the launch uses {launch.get('launcher')}, not the deepspeed launcher"
    options = launch.get("options") or {}
    if bug_id == "user-args-resplit":
        args = list((launch.get("program") or [])[1:])
        try:
            after = resplit(args, str(rec.get("quote") or ""))
        except ValueError as exc:
            bad = [a for a in args if "'" in a or '"' in a]
            return True, (f"the launcher's re-split of the script's arguments raises \"{exc}\" on "
                          f"{', '.join(shlex.quote(a) for a in bad[:3]) or 'them'}")
        if after != args:
            return True, (f"the launcher's re-split hands the script {shlex.join(after)!r} instead of "
                          f"{shlex.join(args)!r}")
        return False, "the launcher's re-split leaves the script's arguments as they are"
    multi = _multi_node(options, hosts)
    if bug_id == "pdsh-ssh-port-keyerror":
        runner = options.get("multinode_launcher") or "pdsh"
        if runner != "pdsh":
            return False, f"the launch uses the {runner} runner, not pdsh"
        if not options.get("ssh_port"):
            return False, "the launch gives no --ssh_port"
        if "PDSH_SSH_ARGS_APPEND" in env:
            return False, "PDSH_SSH_ARGS_APPEND is set in the launch's environment"
        if multi is None:
            return None, "the launch's hostfile was not read, so whether it runs pdsh is not known"
        if not multi:
            return False, "a single-node launch does not run pdsh"
        return True, (f"a multi-node pdsh launch with --ssh_port {options['ssh_port']} and no "
                      "PDSH_SSH_ARGS_APPEND in its environment")
    if bug_id == "openmpi-env-check":
        if options.get("multinode_launcher") != "openmpi":
            return False, "the launch does not use --launcher openmpi"
        missing = [v for v in OMPI_RANK_VARS if v not in env]
        if not missing:
            return False, "the launch's environment has the OMPI_COMM_WORLD_* variables"
        if multi is None:
            return None, "the launch's hostfile was not read, so whether it runs mpirun is not known"
        if not multi:
            return False, "a single-node launch does not run the openmpi runner"
        return True, f"a multi-node openmpi launch from an environment without {', '.join(missing)}"
    if bug_id == "pdsh-export-unquoted":
        runner = options.get("multinode_launcher") or "pdsh"
        if runner != "pdsh":
            return False, f"the launch uses the {runner} runner, not pdsh"
        if exports is None:
            return None, "the exported variables were not read"
        if not exports:
            return False, "no exported value holds a character the remote shell reads as syntax"
        if multi is None:
            return None, "the launch's hostfile was not read, so whether it runs pdsh is not known"
        if not multi:
            return False, "a single-node launch exports nothing through pdsh"
        said = "; ".join(f"{e['name']} (from {e['source']}) holds {e['chars']!r}" for e in exports[:4])
        return True, f"a multi-node pdsh launch that exports {said}"
    raise KeyError(bug_id)
