"""Command line: argument parsing, subcommands and exit codes (0 ok, 1 failing, 2 usage/input, 3 incomplete)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from zdoctor import __version__
from zdoctor.core.errors import InputError, UsageError, ZdoctorError
from zdoctor.core.plural import count_of
from zdoctor.proc import children
from zdoctor.proc.target import OPTION_KEYS, Target
from zdoctor.report.console import print_whatever_is_read, stdout_gone

#: The options a replayed snapshot may be asked with: what the user saw, pasted or as a log.
ASKABLE = ("symptom", "train_log")

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

#: The exit codes as ``--help`` lists them (``CheckReport.exit_code`` gives 0, 1 and 3; errors give 2).
EXIT_CODES_HELP = """exit codes:
  0  nothing failed and every symptom given is explained
  1  a finding failed, or a symptom given is explained by no finding
  2  usage or input error: a bad option, an unreadable file or snapshot (one line on stderr)
  3  incomplete: the training environment itself could not be examined, and nothing else failed"""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


#: Defaults of the target options; they are filled in after parsing (see :func:`parse_args`), so the same
#: option given before the command (``zdoctor --ds-config f check``) or without one is never overwritten.
TARGET_DEFAULTS: dict[str, Any] = {"python": None, "run_command": None, "ext": [], "timeout": None}


def _target_args(sp: argparse.ArgumentParser, top: bool = False) -> None:
    """The options that describe the training to diagnose: interpreter, command, extra extensions, the job.

    ``top``: the parser without a command (``zdoctor --ds-config f`` runs the guide or the check with them); a
    command's parser leaves what was not given on it to the top level's value."""
    given_here = {"default": None} if top else {"default": argparse.SUPPRESS}
    sp.add_argument("--python", metavar="PY", help="the training environment's interpreter "
                    "(default: the first python3 on PATH)", **given_here)
    sp.add_argument("--command", metavar="CMD", dest="run_command", default=argparse.SUPPRESS,
                    help="the failing launch command, run (bounded) under LD_DEBUG to confirm what it loads "
                         "and to try remedies (default: a probe that imports torch and deepspeed and loads "
                         "the JIT-built ops)")
    sp.add_argument("--ext", metavar="PATH", action="append", default=argparse.SUPPRESS,
                    help="an extra extension (.so) the training imports before torch (repeatable)")
    sp.add_argument("--symptom", metavar="TEXT", action="append", default=argparse.SUPPRESS,
                    help="the error you saw (a line of the failing output, pasted); repeatable. zdoctor explains "
                         "it with a finding or shows it as unexplained")
    sp.add_argument("--timeout", metavar="S", type=float, default=argparse.SUPPRESS,
                    help="time limit in seconds for the traced command and for each remedy re-run (default 120, "
                         "stretched up to 4x on a node busier than its CPUs; a limit given here is kept as given)")
    sp.add_argument("--as-root", action="store_const", const=True, default=None,
                    help="refused: code another user can change (the training environment, its site-packages "
                         "and .pth files, a user site) always runs as that user, never as root")
    off = sp.add_argument_group("offload capacity and storage")
    off.add_argument("--ds-config", metavar="FILE", help="the job's DeepSpeed config (JSON/HJSON) to lint and plan")
    off.add_argument("--offload-path", metavar="DIR", help="where NVMe offload would write (default: the config's "
                     "nvme_path)")
    off.add_argument("--user", metavar="NAME", help="the user the training runs as, who owns the offload "
                     "directory (default: the owner of the --python environment, else SUDO_USER, else you)")
    off.add_argument("--model-params", metavar="N", help="total model parameters (e.g. 2851M, 7e9, 70B)")
    off.add_argument("--model-config", metavar="FILE", help="a Hugging Face config.json to estimate parameters from")
    off.add_argument("--nodes", metavar="N", type=int, default=None, help="nodes in the job (default 1)")
    off.add_argument("--gpus-per-node", metavar="N", type=int, default=None,
                     help="GPUs per node (default: the GPUs this node has, else 1)")
    off.add_argument("--log", metavar="FILE", dest="train_log", help="a training log with wall_clock_breakdown lines")
    off.add_argument("--io-size", metavar="SIZE", default=None,
                     help="size of the O_DIRECT throughput test on the offload path (default 1G at most; 0 skips)")
    off.add_argument("--gpu-sample", metavar="S", type=float, default=None,
                     help="sample GPU utilisation for S seconds (default: no sampling)")
    off.add_argument("--p2p-test", action="store_true", default=None,
                     help="copy 64 MiB between each pair of GPUs through torch (bounded; off by default)")
    hang = sp.add_argument_group("hangs")
    hang.add_argument("--pid", metavar="PID", type=int, default=None,
                      help="the training job's process: it and its descendants are the job the hang check judges "
                           "(default: the processes running --command, else every python, launcher and compiler "
                           "process on this node)")
    hosts = sp.add_argument_group("the job's hosts")
    hosts.add_argument("--hostfile", metavar="FILE", default=None,
                       help="the job's DeepSpeed hostfile (`worker-1 slots=8`) or host list: each host must resolve "
                            "here and ssh must reach it, and NCCL's interface must route to each host's address "
                            "(MASTER_ADDR is read from the training environment; default: the hostfile the "
                            "--command names)")
    for action in off._group_actions + hang._group_actions + hosts._group_actions:
        action.default = argparse.SUPPRESS


def _fleet_parser(sub: Any) -> None:
    from zdoctor.fleet.launch import DEFAULT_PARALLEL, DEFAULT_TIMEOUT, LAUNCHERS

    f = sub.add_parser("fleet", help="snapshot every node of a multi-node job through pdsh, ssh or srun; "
                       "show the node x check matrix and the facts that differ")
    f.add_argument("--hostfile", metavar="FILE", help="a DeepSpeed hostfile (`worker-1 slots=8`) or a list of "
                   "hosts, one per line (under srun, default: the allocation's $SLURM_JOB_NODELIST)")
    f.add_argument("--launcher", choices=LAUNCHERS, default=None,
                   help="how to reach the nodes (default: srun for a Slurm node list, else pdsh when installed, "
                        "else ssh)")
    f.add_argument("--python", metavar="PY", dest="sub_python", help="the training interpreter on the nodes")
    f.add_argument("--zdoctor", metavar="CMD", default="zdoctor",
                   help="how to run zdoctor on the nodes (default: zdoctor; e.g. '/opt/venv/bin/zdoctor')")
    f.add_argument("--ext", metavar="PATH", action="append", default=[],
                   help="an extension the training imports before torch, at this path on every node")
    job = f.add_argument_group("the job, as every node should see it (paths are the same on every node)")
    job.add_argument("--ds-config", metavar="FILE", help="the job's DeepSpeed config")
    job.add_argument("--model-params", metavar="N", help="total model parameters (e.g. 2851M, 7e9, 70B)")
    job.add_argument("--model-config", metavar="FILE", help="a Hugging Face config.json to estimate parameters from")
    job.add_argument("--offload-path", metavar="DIR", help="where NVMe offload writes (default: the config's "
                     "nvme_path)")
    job.add_argument("--io-size", metavar="SIZE", help="size of each node's O_DIRECT throughput test (0 skips)")
    job.add_argument("--gpu-sample", metavar="S", type=float, help="sample GPU utilisation for S seconds on each node")
    job.add_argument("--pid", metavar="[HOST=]PID", action="append", default=[],
                     help="a hung job: on every node (PID), or on node HOST (HOST=PID, repeatable), the pid of a "
                          "rank or its launcher; each node shows where its ranks wait, and the fleet which rank on "
                          "which node is out of step")
    f.add_argument("--parallel", metavar="N", type=int, default=DEFAULT_PARALLEL,
                   help=f"nodes probed at once (default {DEFAULT_PARALLEL})")
    f.add_argument("--timeout", metavar="S", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds each node may take, connecting included (default {DEFAULT_TIMEOUT:g})")
    f.add_argument("--ssh-config", metavar="FILE", help="an ssh client config file for pdsh and ssh (ssh -F)")
    f.add_argument("--push", action="store_true",
                   help="copy zdoctor.pyz to nodes without zdoctor of this version, run it from a private "
                        "temporary directory and remove it (ssh and pdsh)")
    f.add_argument("--bundle", metavar="FILE", help="the zdoctor.pyz for --push (default: the one running)")
    f.add_argument("--replay", metavar="SESSION", help="evaluate a recorded fleet session again (an id, or last)")
    f.add_argument("--json", action="store_true", help="print one JSON document instead of the report")
    f.add_argument("--tui", action="store_true", help="show the result in the fleet screen")
    f.add_argument("--no-log", action="store_true", help="do not record a session log")
    f.add_argument("-v", "--verbose", action="store_true", help="details and remedies of every finding")


def build_parser(commands: bool = True) -> Parser:
    """zdoctor's command line; without ``commands``, only the top level (what a bare ``zdoctor`` parses)."""
    p = Parser(prog="zdoctor", description="Diagnose DeepSpeed ZeRO-3 Offload launches that die, "
               "hang or crawl. With no command: the guided session on a terminal, `check` otherwise.",
               epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"zdoctor {__version__}")
    from zdoctor.front.tui import add_session_arguments

    add_session_arguments(p)
    _target_args(p, top=True)
    if not commands:
        p.set_defaults(command=None)
        return p
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    c = sub.add_parser("check", help="run every check headless; exit 1 if anything fails",
                       description="Run every check headless and print the report.", epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _target_args(c)
    c.add_argument("--json", action="store_true", help="print one JSON document instead of the report")
    c.add_argument("--replay", metavar="SNAP", help="evaluate a snapshot instead of this machine")
    c.add_argument("--playbook", metavar="ID", action="append",
                   help="walk only this playbook (repeatable; default: all)")
    c.add_argument("--no-log", action="store_true", help="do not record a session log")
    c.add_argument("-v", "--verbose", action="store_true", help="show details and remedies of every finding")

    s = sub.add_parser("snapshot", help="record every probe's facts and evidence for replay elsewhere")
    _target_args(s)
    s.add_argument("-o", "--output", metavar="FILE", required=True,
                   help="where to write the snapshot (JSON); - writes it to standard output")
    s.add_argument("--armor", action="store_true",
                   help="write it gzipped and base64-armored between marker lines (how `fleet` carries it)")

    e = sub.add_parser("export", help="render a recorded session as Markdown, HTML or JSON")
    which = e.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", action="store_true", help="the most recent session")
    which.add_argument("--session", metavar="ID", help="a session id (see the session directory)")
    e.add_argument("--format", required=True, choices=("md", "html", "json"))
    e.add_argument("-o", "--output", metavar="FILE", help="write here instead of standard output")

    pb = sub.add_parser("playbooks", help="list, show or lint the decision graphs")
    pbs = pb.add_subparsers(dest="pb_command", metavar="ACTION", parser_class=Parser, required=True)
    pbs.add_parser("list", help="every bundled playbook")
    show = pbs.add_parser("show", help="one playbook's nodes and edges")
    show.add_argument("id")
    pbs.add_parser("predicates", help="every named condition an edge may use, with what it asks")
    pbs.add_parser("vocabulary", help="every check: its module, the probes it reads, the finding ids it produces "
                                      "and the symptom kinds it explains")
    lint = pbs.add_parser("lint", help="validate playbook files (default: the bundled ones)")
    lint.add_argument("path", nargs="?", help="a playbook file or a directory of them")

    _fleet_parser(sub)

    bb = sub.add_parser("build-bundle", help="build zdoctor.pyz: one file that runs with any python3 >= 3.8.1 "
                        "on Linux x86_64 and aarch64, without network or pip")
    bb.add_argument("-o", "--output", metavar="FILE", default="zdoctor.pyz", help="where (default: zdoctor.pyz)")
    bb.add_argument("--wheels", metavar="DIR",
                    help="the dependencies' wheels, already downloaded (default: pip download, cached)")

    t = sub.add_parser("tui", help="the guided session (the default on a terminal)")
    _target_args(t)
    add_session_arguments(t)
    return p


def _python(args: argparse.Namespace) -> str | None:
    return args.python


def _live_host(args: argparse.Namespace):
    """The live host for the training job the arguments describe (its :class:`Target`, validated once)."""
    from zdoctor.host import LiveHost

    if getattr(args, "as_root", None):
        raise UsageError("zdoctor: --as-root is refused: code another user can change (their environment, "
                         "site-packages, .pth files, user site) never runs as root; zdoctor runs it as that user")
    target = Target.from_args(_python(args), getattr(args, "run_command", None), getattr(args, "ext", None) or [],
                              getattr(args, "timeout", None), {k: getattr(args, k, None) for k in OPTION_KEYS})
    return LiveHost(target=target)


def _open_log(mode: str, argv: Sequence[str], host_info: dict[str, Any], enabled: bool):
    """A session log, or None (with a one-line warning) when the state directory cannot be written."""
    if not enabled:
        return None
    from zdoctor.walk.session import SessionLog

    try:
        return SessionLog.create(mode, list(argv), host_info)
    except (OSError, ZdoctorError) as exc:
        print(f"zdoctor: warning: session not recorded: {exc}", file=sys.stderr)
        return None


def cmd_check(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from zdoctor.host import ReplayHost

    if args.replay and (_python(args) or args.run_command or args.ext or args.timeout
                        or any(getattr(args, k, None) is not None for k in OPTION_KEYS if k not in ASKABLE)):
        raise UsageError("zdoctor check: --replay excludes --python and the options describing a job "
                         "(a snapshot is replayed as it was recorded; --symptom and --log may be added)")
    host = ReplayHost.load(args.replay) if args.replay else _live_host(args)
    early = None
    if not args.replay:
        from zdoctor.layers.libraries.importrun import import_run

        early = import_run(host)  # every check runs the live trace: its run (torch's import) starts before they load
    try:
        return _check_on(host, args, argv)
    except BaseException:
        if early is not None:
            early.stop()  # a check that fails before its probes read the run leaves nothing of it running
        raise


def _check_on(host: Any, args: argparse.Namespace, argv: Sequence[str]) -> int:
    """The check of ``host`` as ``args`` ask, from its playbooks to the printed report; its exit code."""
    from zdoctor.walk.doctor import check, select_playbooks

    books = select_playbooks(args.playbook)
    if args.replay and any(getattr(args, k, None) is not None for k in ASKABLE):
        # what the user was sent, matched against the recorded node: read here, as given
        asked = Target.from_args(None, None, [], None, {k: getattr(args, k, None) for k in ASKABLE})
        host.ask(asked.options)
    log = _open_log("check", argv, host.info, not args.no_log)
    record = log.record if log else (lambda _t, _d: None)
    from zdoctor.report.progressline import ProgressLine

    with ProgressLine(enabled=not args.json):
        report = check(host, record=record, playbooks=books)
    if log:
        report.session = log.id
        log.close(report.exit_code)
        if log.failure is not None and log.capped:
            print(f"zdoctor: warning: the session was recorded only in part ({log.failure})", file=sys.stderr)
        elif log.failure is not None:
            report.session = None
            print(f"zdoctor: warning: the session could not be recorded ({log.failure}); the report is complete "
                  "but export and --resume cannot use this run", file=sys.stderr)
    from zdoctor.report.reportdoc import from_check
    from zdoctor.report.terminal import check_json, print_report

    shown = from_check(report.redacted())
    if args.json:
        print_whatever_is_read(lambda: sys.stdout.write(check_json(shown)))
    else:
        print_whatever_is_read(lambda: print_report(shown, verbose=args.verbose))
    return report.exit_code


def cmd_snapshot(args: argparse.Namespace) -> int:
    from zdoctor.edit.atomic import write_text_atomic
    from zdoctor.walk.doctor import snapshot
    doc = snapshot(_live_host(args))
    if args.armor:
        from zdoctor.fleet.armor import encode

        text = encode(doc)
    else:
        import json  # only here: the guide's first screen does not wait for it

        text = json.dumps(doc, indent=1) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text_atomic(args.output, text)
    crashed = [n for n, r in doc["probes"].items() if r["status"] in ("crash", "timeout")]
    where = "standard output" if args.output == "-" else args.output
    print(f"zdoctor: snapshot of {len(doc['probes'])} probes written to {where}"
          + (f" ({len(crashed)} crashed: {', '.join(crashed)})" if crashed else ""), file=sys.stderr)
    return EXIT_OK


def cmd_fleet(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from zdoctor.front.fleet_command import run_fleet

    return run_fleet(args, argv, _open_log)


def cmd_export(args: argparse.Namespace) -> int:
    from zdoctor.report.export import render, write_export
    from zdoctor.walk.session import last_session_id, load_events

    sid = last_session_id() if args.last else args.session
    events = load_events(sid)
    note = events.damage_note()
    if note:
        print(f"zdoctor: warning: {note}; exporting the rest", file=sys.stderr)
    text = render(events, args.format)
    if args.output:
        write_export(text, args.output)
        print(f"zdoctor: session {sid} exported to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def cmd_build_bundle(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zdoctor.front.bundle.build import build

    out = Path(args.output)
    if not out.parent.is_dir():
        raise InputError(f"{out.parent}: no such directory")
    wheels = Path(args.wheels) if args.wheels else None
    if wheels is not None and not wheels.is_dir():
        raise InputError(f"{wheels}: no such directory")
    manifest = build(out, wheels)
    deps = ", ".join(f"{k} {v}" for k, v in sorted(manifest["deps"].items()))
    print(f"zdoctor: {out} built ({out.stat().st_size / 2**20:.1f} MiB; {deps}; psutil's native module for "
          f"{', '.join(sorted(manifest['native']))})", file=sys.stderr)
    return EXIT_OK


def _print_vocabulary(which: str) -> None:
    """What playbooks may name: the named predicates (``predicates``), or every check (``vocabulary``)."""
    from zdoctor.core.registry import CHECKS, PREDICATES, load_vocabulary

    load_vocabulary()
    if which == "predicates":
        for name, spec in sorted(PREDICATES.items()):
            print(f"{name}  (reads {', '.join(spec.probes) or 'nothing'})")
            print(f"    {spec.doc}")
        print("An edge may also say `when = {finding = \"ID\", status = [\"warn\", \"fail\"]}` or "
              "`when = {fact = \"probe.key\", equals = VALUE}` instead of naming a predicate.")
        return
    for name, check in sorted(CHECKS.items()):
        print(f"{name}  ({check.func.__module__})")
        print(f"    probes: {', '.join(check.probes) or '-'}")
        print(f"    findings: {', '.join((name, *check.findings))}")
        print(f"    explains: {', '.join(check.explains) or '-'}")


def cmd_playbooks(args: argparse.Namespace) -> int:
    from zdoctor.walk import playbook as pbmod

    if args.pb_command == "list":
        for pid, book in sorted(pbmod.load_all().items()):
            print(f"{pid:<20} {book.title}")
            print(f"{'':<20} {book.summary.splitlines()[0] if book.summary else ''}")
        return EXIT_OK
    if args.pb_command in ("predicates", "vocabulary"):
        _print_vocabulary(args.pb_command)
        return EXIT_OK
    if args.pb_command == "show":
        books = pbmod.load_all()
        if args.id not in books:
            raise UsageError(f"zdoctor playbooks show: no playbook {args.id!r} "
                             f"(known: {', '.join(sorted(books))})")
        print(pbmod.describe(books[args.id]))
        return EXIT_OK
    from zdoctor.core.resources import data_dir
    from zdoctor.walk.playbook_lint import lint_path

    target = args.path or str(data_dir("playbooks"))
    if not os.path.exists(target):
        raise InputError(f"{target}: no such file or directory")
    errors = lint_path(target)
    for err in errors:
        print(str(err))
    if errors:
        print(f"zdoctor: {count_of(len(errors), 'lint error')}", file=sys.stderr)
        return EXIT_FAIL
    print(f"zdoctor: {target}: playbooks are valid", file=sys.stderr)
    return EXIT_OK


def cmd_tui(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """The guided session on a terminal; without one, the headless check."""
    from zdoctor.front.tui import session_options

    session = session_options(args)
    if any(v is not None for v in session.values()):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise UsageError("zdoctor: --resume and --demo need a terminal")
        if _python(args) or getattr(args, "run_command", None) or getattr(args, "ext", None):
            raise UsageError("zdoctor: --resume and --demo take no --python, --command or --ext "
                             "(they continue a recorded session or replay a recorded node)")
        from zdoctor.front.tui import run_tui

        return run_tui(python=None, argv=list(argv), **session)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        ns = argparse.Namespace(python=_python(args), json=False, replay=None,
                                playbook=None, no_log=False, verbose=False,
                                run_command=getattr(args, "run_command", None), ext=getattr(args, "ext", []),
                                timeout=getattr(args, "timeout", None),
                                **{k: getattr(args, k, None) for k in OPTION_KEYS})
        return cmd_check(ns, argv)
    from zdoctor.front.tui import run_tui

    return run_tui(python=_python(args), argv=list(argv), host=_live_host(args))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse the command line; the target options given nowhere get their defaults. A bare ``zdoctor`` (the
    guide's start, where every millisecond shows) builds only the top level of the parser."""
    args = build_parser(commands=bool(argv)).parse_args(argv)
    for key, value in {**TARGET_DEFAULTS, **{k: None for k in OPTION_KEYS}}.items():
        if not hasattr(args, key):
            setattr(args, key, list(value) if isinstance(value, list) else value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    children.install_signal_handlers()  # an SSH drop (SIGHUP), SIGTERM or SIGINT ends what zdoctor started
    try:
        return _dispatch(argv)
    finally:
        children.shutdown()  # the guide quit (q, or left) while a command ran: end its tree, clean up after it


def _dispatch(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
        if args.command == "check":
            return cmd_check(args, argv)
        if args.command == "snapshot":
            return cmd_snapshot(args)
        if args.command == "fleet":
            return cmd_fleet(args, argv)
        if args.command == "export":
            return cmd_export(args)
        if args.command == "playbooks":
            return cmd_playbooks(args)
        if args.command == "build-bundle":
            return cmd_build_bundle(args)
        return cmd_tui(args, argv)
    except ZdoctorError as exc:
        print(f"zdoctor: error: {exc}" if not str(exc).startswith("zdoctor") else f"{exc}",
              file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        from zdoctor.walk.session import close_open_logs

        close_open_logs(130)  # the session still ends on record
        print("zdoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`zdoctor playbooks list | head`): nothing left to say to it.
        stdout_gone()
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the user gets one line; ZDOCTOR_DEBUG=1 shows the traceback
        if os.environ.get("ZDOCTOR_DEBUG"):
            raise
        print(f"zdoctor: internal error: {type(exc).__name__}: {exc} (ZDOCTOR_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return EXIT_USAGE
