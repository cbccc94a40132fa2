"""Apply an fstab remedy through the safe core, as its own process (the guide starts it under sudo).

``python -m zdoctor.layers.offload.fstab_apply --fstab F --line L --backup B [--no-mount]`` runs
:func:`zdoctor.layers.offload.fstab.apply_fstab_line`: the new file is validated beside the old one with
``findmnt --verify --tab-file``, the old one is backed up to ``B`` (the name the remedy's undo gives),
the new one replaces it in one rename, and a failed mount puts the old one back. Each step is printed
as it is done; the last line, unless the output is a terminal, is ``zdoctor-fstab-record: {json}``. Exit 0
when everything worked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import zdoctor
from zdoctor.core.model import Evidence
from zdoctor.layers.offload.fstab import FSTAB, apply_fstab_line, parse_fstab
from zdoctor.proc import runner
from zdoctor.proc.systools import system_tool_or_name

RECORD_PREFIX = "zdoctor-fstab-record: "


def action_argv(action: dict[str, Any]) -> list[str]:
    """The argv that applies an ``fstab-add`` remedy action with this interpreter and this zdoctor."""

    home = os.path.dirname(os.path.dirname(os.path.abspath(zdoctor.__file__)))
    boot = (f"import sys; sys.path.insert(0, {home!r}); from zdoctor.layers.offload.fstab_apply import main; "
            "sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-I", "-c", boot, "--fstab", str(action["fstab"]), "--line", str(action["line"]),
            "--backup", str(action["backup"])]
    return argv + ([] if action.get("mount", True) else ["--no-mount"])


def _mount_argv(fstab: str, mountpoint: str) -> list[str]:
    mount = system_tool_or_name("mount")
    return [mount, "--", mountpoint] if fstab == FSTAB else [mount, "--fstab", fstab, "--", mountpoint]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zdoctor-fstab-apply", description=__doc__)
    parser.add_argument("--fstab", default=FSTAB)
    parser.add_argument("--line", required=True)
    parser.add_argument("--backup", required=True)
    parser.add_argument("--no-mount", action="store_true")
    args = parser.parse_args(argv)

    entries = parse_fstab(args.line)
    if len(entries) != 1:
        print(f"zdoctor: error: not one fstab line: {args.line!r}", file=sys.stderr)
        return 2
    mountpoint = entries[0].file

    def mount() -> Any:
        if args.no_mount:

            return Evidence(label="mount (not asked for)", kind="note", exit_code=0)
        return runner.run(_mount_argv(args.fstab, mountpoint), timeout=60, label="mount")

    printed: list[str] = []

    def step(text: str) -> None:
        printed.append(text)
        print(text, flush=True)

    rec = apply_fstab_line(args.fstab, args.line, mount=mount, backup=args.backup, on_step=step,
                           make_mountpoint=not args.no_mount, findmnt=system_tool_or_name("findmnt"))
    if rec.ok and args.fstab == FSTAB and os.path.isdir("/run/systemd/system"):
        ev = runner.run([system_tool_or_name("systemctl"), "daemon-reload"], timeout=60,
                        label="systemctl daemon-reload")
        note = "ran systemctl daemon-reload" if ev.exit_code == 0 and not ev.error else \
            f"systemctl daemon-reload failed ({ev.error or ev.stderr.strip() or ev.exit_code}): run it by hand"
        rec.steps.append(note)
    for text in rec.steps[len(printed):]:  # the rollback's steps, and the reload
        step(text)
    if rec.error:
        print(f"error: {rec.error}", flush=True)
    if not sys.stdout.isatty():  # the record is for a program reading the output, not for a person
        print(RECORD_PREFIX + json.dumps(rec.to_dict()), flush=True)
    return 0 if rec.ok else 1


if __name__ == "__main__":
    sys.exit(main())
