"""The training job as one object: built and validated once from the command line, carried by the host,
recorded in the session's start event and rebuilt from it on resume; one resolution of the interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from zdoctor.core.errors import UsageError
from zdoctor.host import LiveHost
from zdoctor.layers.libraries.importrun import target_python
from zdoctor.proc.target import Target, target_of
from zdoctor.walk.resume import rebuild_host


def test_from_args_validates_once(tmp_path: Path):
    cfg = tmp_path / "ds.json"
    cfg.write_text("{}")
    t = Target.from_args(sys.executable, "python -c 1", [], 30.0, {"ds_config": str(cfg), "nodes": 2})
    assert t.python_explicit and t.options == {"ds_config": str(cfg), "nodes": 2} and t.timeout == 30.0
    for bad, msg in [(dict(command="  "), "--command is empty"), (dict(timeout=0.0), "--timeout"),
                     (dict(ext=[str(tmp_path / "none.so")]), "--ext"), (dict(options={"nodes": 0}), "--nodes"),
                     (dict(options={"ds_config": str(tmp_path / "gone.json")}), "--ds-config")]:
        args = {"python": None, "command": None, "ext": [], "timeout": None, "options": {}, **bad}
        with pytest.raises(UsageError, match=msg):
            Target.from_args(**args)


def test_the_host_carries_it_and_the_session_records_and_rebuilds_it(tmp_path: Path):
    ext = tmp_path / "op.so"
    ext.write_bytes(b"")
    t = Target.from_args(sys.executable, "true", [str(ext)], 12.0, {"model_params": "7B"})
    host = LiveHost(target=t)
    assert target_of(host) is t and host.env is t.env
    info = host.info
    assert {k: info[k] for k in ("python", "python_explicit", "command", "ext", "timeout", "options")} == t.to_info()
    again = target_of(rebuild_host(info))
    assert again.to_info() == t.to_info()
    assert Target.from_info({"python": "/x/python", "python_explicit": False}).python == "python3"


def test_one_resolution_of_the_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A path is expanded (~) and must be an executable file, whichever probe asks."""
    home = tmp_path / "home"
    (home / "env" / "bin").mkdir(parents=True)
    py = home / "env" / "bin" / "python"
    py.write_text("#!/bin/sh\n")
    monkeypatch.setenv("HOME", str(home))
    host = LiveHost(python="~/env/bin/python")
    assert target_python(host) is None  # not executable
    assert target_of(host).resolve_python()[1] == "not_executable"
    os.chmod(py, 0o755)
    assert target_python(host) == str(py) == target_of(host).resolve_python()[0]
    bare = LiveHost(python="python3", env={"PATH": str(home / "env" / "bin")})
    assert target_python(bare) is None and target_of(bare).resolve_python()[1] == "missing"
