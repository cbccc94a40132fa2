"""Root against the training user: a real unprivileged user (created here, removed after) races zdoctor
with a compiled racer, and zdoctor must never write, copy or delete through what the user swapped in."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from racekit import build_racer, can_race, intact, loop_device, racing, unprivileged_user, user_dir

from zdoctor.storage import iotest

pytestmark = pytest.mark.skipif(can_race() is not None, reason=can_race() or "")

#: How long each race runs (the old code lost within a few tries).
RACE_SECONDS = 6.0


@pytest.fixture
def racer_user():
    with unprivileged_user() as user:
        yield user


@pytest.fixture
def root_dir():
    """A root-owned folder (0755) the racing user can read, for the racer and root's own files."""
    d = Path(tempfile.mkdtemp(prefix="zdrace-root-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("which", ["odirect", "iotest"])
def test_odirect_tests_never_write_through_a_link_swapped_in_for_their_file(racer_user, root_dir, which):
    racer = build_racer("swap_in_link", root_dir)
    with user_dir(racer_user) as offload, loop_device(root_dir) as (dev, _backing):
        size = 16 << 20
        with racing(racer_user, [str(racer), str(offload), f".zdoctor-{which}-", dev, "both"]) as proc:
            deadline = time.monotonic() + RACE_SECONDS
            runs = 0
            while time.monotonic() < deadline:
                res = iotest.odirect_check(str(offload)) if which == "odirect" else \
                    iotest.measure(str(offload), 1 << 20, block=4096, queue_depth=1, time_limit=2)
                runs += 1
                assert intact(dev, size), f"run {runs} wrote into {dev} through the swapped-in link: {res}"
            os.kill(proc.pid, 9)
            proc.wait()
            swaps = proc.stdout.read().decode().count("swapped") if proc.stdout else 0
        assert swaps > 0, "the racer never got to swap a link in: the race did not run"
        assert intact(dev, size)
        assert not [p for p in offload.iterdir() if p.name.startswith(f".zdoctor-{which}-") and not p.is_symlink()]
