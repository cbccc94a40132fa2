"""A FIFO, a device or a looping link where the training's libraries, JIT ops or shell start-up files are
read is named as what it is, in one finding, found without opening it; every other probe still answers
(none times out or crashes on it); the remedy removes each only while it is still of its kind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import run_cli

from zdoctor.layers.python_env.specialfiles import scan


def plant(root: Path) -> dict[str, Path]:
    lib, op, home = root / "lib", root / "ext" / "cpu_adam", root / "home"
    for d in (lib, op, home):
        d.mkdir(parents=True)
    os.mkfifo(lib / "libstdc++.so.6")
    (lib / "libloop.so").symlink_to("libloop2.so")
    (lib / "libloop2.so").symlink_to("libloop.so")
    (lib / "libc10.so").symlink_to("/dev/null")  # a character device
    (lib / "libgood.so.1").write_bytes(b"\x7fELF")
    (root / "loopdir").symlink_to("loopdir2")
    (root / "loopdir2").symlink_to("loopdir")
    os.mkfifo(op / "cpu_adam.so")
    os.mkfifo(home / ".bashrc")
    return {"lib": lib, "ext": root / "ext", "home": home, "loop": root / "loopdir"}


def test_the_reader_names_each_kind_without_opening_anything(tmp_path: Path):
    p = plant(tmp_path)
    env = {"LD_LIBRARY_PATH": f"{p['lib']}:{p['loop']}", "TORCH_EXTENSIONS_DIR": str(p["ext"])}
    facts = scan(env, str(p["home"]))
    kinds = {Path(f["path"]).name: (f["kind"], f["where"]) for f in facts["found"]}
    assert kinds == {
        "libstdc++.so.6": ("a FIFO (named pipe)", f"on LD_LIBRARY_PATH ({p['lib']})"),
        "libloop.so": ("a symbolic link that loops", f"on LD_LIBRARY_PATH ({p['lib']})"),
        "libloop2.so": ("a symbolic link that loops", f"on LD_LIBRARY_PATH ({p['lib']})"),
        "libc10.so": ("a character device", f"on LD_LIBRARY_PATH ({p['lib']})"),
        "loopdir": ("a symbolic link that loops", "an LD_LIBRARY_PATH entry"),
        "cpu_adam.so": ("a FIFO (named pipe)", "in the JIT op cache"),
        ".bashrc": ("a FIFO (named pipe)", "a shell start-up file"),
    }


def test_check_names_them_in_one_finding_and_every_other_probe_answers(tmp_path: Path):
    p = plant(tmp_path)
    env = dict(os.environ, HOME=str(p["home"]), XDG_STATE_HOME=str(tmp_path / "state"),
               LD_LIBRARY_PATH=f"{p['lib']}:{p['loop']}", TORCH_EXTENSIONS_DIR=str(p["ext"]), NO_COLOR="1")
    proc = run_cli(["check", "--json", "--no-log", "--python", "/usr/bin/python3"], env=env, timeout=600)
    doc = json.loads(proc.stdout)
    (f,) = [x for x in doc["findings"] if x["id"].startswith("pyenv.special-files")]
    assert f["status"] == "fail" and f["title"].startswith("7 special files")
    for name, kind in (("libstdc++.so.6", "a FIFO (named pipe)"), ("libloop.so", "a symbolic link that loops"),
                       ("libc10.so", "a character device"), ("cpu_adam.so", "a FIFO (named pipe)"),
                       (".bashrc", "a FIFO (named pipe)")):
        assert f"{name}: {kind}" in f["detail"], (name, f["detail"])
    assert "a hang" in f["detail"]
    assert not [x for x in doc["findings"] if x["id"].startswith("probe.")], \
        [(x["id"], x["title"]) for x in doc["findings"] if x["id"].startswith("probe.")]
    # the remedy removes each only while it is what was found: a regular file put in one's place stays
    (rem,) = f["remedies"]
    (p["lib"] / "libstdc++.so.6").unlink()
    (p["lib"] / "libstdc++.so.6").write_text("a real file now")
    for line in rem["commands"]:
        subprocess.run(["bash", "-c", line], timeout=30)
    assert (p["lib"] / "libstdc++.so.6").read_text() == "a real file now"
    assert not (p["ext"] / "cpu_adam" / "cpu_adam.so").exists() and not (p["home"] / ".bashrc").exists()
    assert not os.path.lexists(p["lib"] / "libloop.so") and not os.path.lexists(p["lib"] / "libc10.so")
    assert (p["lib"] / "libgood.so.1").exists()
