"""The commands of the probes no one waits for run at a lower CPU priority than torch's import."""

from __future__ import annotations

import os

from zdoctor.core.registry import PROBES, load_vocabulary, probe
from zdoctor.host.base import run_probe_guarded
from zdoctor.proc import contain
from zdoctor.proc.runner import run


def _nice_of_a_real_command() -> int:
    ev = run(["nice"], env={"PATH": "/usr/bin:/bin"}, timeout=20)
    assert ev.exit_code == 0, (ev.error, ev.stderr)
    return int(ev.stdout.strip())


def test_a_command_started_in_a_background_block_runs_niced_and_only_there():
    mine = os.nice(0)
    assert _nice_of_a_real_command() == mine
    with contain.background():
        assert _nice_of_a_real_command() == min(19, mine + contain.BACKGROUND_NICE)
    assert _nice_of_a_real_command() == mine  # the block's end restores it


def test_a_background_probe_runs_its_commands_niced_and_a_foreground_one_does_not():
    mine = os.nice(0)
    try:
        probe("test_bg_probe", title="t", background=True)(lambda host: ({"nice": _nice_of_a_real_command()}, []))
        probe("test_fg_probe", title="t")(lambda host: ({"nice": _nice_of_a_real_command()}, []))
        assert run_probe_guarded(object(), "test_bg_probe").facts["nice"] == min(19, mine + contain.BACKGROUND_NICE)
        assert run_probe_guarded(object(), "test_fg_probe").facts["nice"] == mine
    finally:
        PROBES.pop("test_bg_probe", None)
        PROBES.pop("test_fg_probe", None)


def test_the_new_layers_side_probes_are_background_and_the_import_path_is_not():
    load_vocabulary()
    assert all(PROBES[n].background for n in ("nccl_net", "driver_parts", "gpucap", "jitbuildlog"))
    # what every finding waits for, and the re-runs that try the fixes, keep the full priority
    assert not any(PROBES[n].background for n in ("pyenv", "livetrace", "libs", "libfix", "cudalookup"))
