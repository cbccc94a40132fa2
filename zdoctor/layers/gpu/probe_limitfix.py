"""Probe ``limitfix``: the raised open-files limit tried on the failing command before it is offered.

When the ``--command`` run said "Too many open files" and the training shell's soft ``ulimit -n`` is below
its hard limit, the command is run again from a shell that first does what the remedy says
(``ulimit -n N``), as the training user, bounded: the remedy is then "tried: fixed" or "tried: did not
fix", with what the re-run showed. Nothing on the node changes.
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import LimitfixFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.proc.privilege import runs_as_of
from zdoctor.proc.runner import run
from zdoctor.proc.target import target_of
from zdoctor.readers.hostlimits import raised_nofile
from zdoctor.symptoms.match import ids_for

TRIAL_TIMEOUT = 120.0
#: The trial's shell: the remedy's own line, then the command itself.
TRIAL_SCRIPT = 'ulimit -n "$1" || exit 125; shift; exec "$@"'


@probe("limitfix", title="The raised open-files limit, tried on the failing command", timeout=TRIAL_TIMEOUT + 30,
       needs=("symptoms", "host_limits", "livetrace"), facts=LimitfixFacts)
def limitfix_probe(host: Any) -> tuple[LimitfixFacts, list[Evidence]]:
    """Re-run the failing command with ``ulimit -n`` raised, when it failed for want of file descriptors."""
    target = target_of(host)
    if not target.command:
        return {"skipped": "no --command to try the raised limit on"}, []
    if not ids_for(host.results(["symptoms"]), "nofile"):
        return {"skipped": "the command did not fail with 'Too many open files'"}, []
    shell = (facts_of(host, "host_limits").get("target") or {})
    new = raised_nofile(shell.get("nofile_soft"), shell.get("nofile_hard"))
    if new is None:
        return {"skipped": "the soft limit is not below the hard one (only root can raise the hard limit)"}, []
    argv = ["/bin/bash", "-c", TRIAL_SCRIPT, "zdoctor-trial", str(new), "/bin/sh", "-c", target.command]
    timeout = target.limit(TRIAL_TIMEOUT)
    ev = run(argv, env=dict(target.env), timeout=timeout, label=f"re-run with ulimit -n {new}",
             run_as=runs_as_of(host))
    fixed = ev.exit_code == 0 and ev.error is None
    return {"limit": new, "exit_code": ev.exit_code, "error": ev.error, "fixed": fixed,
            "still_emfile": "Too many open files" in (ev.stderr or "") + (ev.stdout or "")}, [ev]
