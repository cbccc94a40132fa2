"""The launch layer's probes and checks run in a process of their own (inside the test's namespaces): the
program for ``python -c`` and its one argument."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence

#: argv[1] is ``[env, command, log, probes, checks]``; it prints ``{"facts": {probe: facts}, "symptoms": [...],
#: "findings": {check: [finding, ...]}}``. The symptoms are the log's; pyenv is settled empty (no interpreter).
PROBE = textwrap.dedent("""
    import json, sys
    from zdoctor.layers import evaluate_check
    from zdoctor.host import LiveHost
    from zdoctor.core.model import ProbeResult
    from zdoctor.core.registry import Facts, load_vocabulary
    from zdoctor.symptoms.extract import from_text
    from zdoctor.proc.target import Target
    load_vocabulary()
    env, command, log, probes, checks = json.loads(sys.argv[1])
    host = LiveHost(target=Target.of(env=env, command=command))
    symptoms = ProbeResult(probe="symptoms", facts={"symptoms": [s.to_dict() for s in from_text(log, "log")]})
    host.settle("symptoms", symptoms)
    host.settle("pyenv", ProbeResult(probe="pyenv", facts={}))
    facts = Facts(dict(host.results([*probes, "symptoms"]).items()))
    print(json.dumps({"facts": {p: facts[p].facts for p in probes}, "symptoms": symptoms.facts["symptoms"],
                      "findings": {n: [f.to_dict() for f in evaluate_check(n, facts)] for n in checks}}))
""")


def probe_argument(env: dict[str, str], command: str, log: str, probes: Sequence[str], checks: Sequence[str]) -> str:
    """:data:`PROBE`'s argument: run ``probes`` for a launch of ``command`` in ``env`` that printed ``log``,
    then evaluate ``checks``."""
    return json.dumps([env, command, log, list(probes), list(checks)])
