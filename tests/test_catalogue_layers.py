"""The symptom catalogue is kept by node layer: each layer's known messages live in its package
(``zdoctor/layers/<layer>/symptoms.toml``), the folder names the entry's layer (a key of ``LAYERS``), and
``catalogue.ORDER`` alone decides which entry is tried first, across the layers' files. A broken data file
is refused in one line that names the file and the entry."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO

from zdoctor.core.errors import InputError
from zdoctor.core.nodelayers import BY_ID, LAYERS
from zdoctor.core.registry import CHECKS, load_vocabulary
from zdoctor.core.tomlfile import load_toml_file
from zdoctor.symptoms.catalogue import LAYER_FILE, ORDER, SIGNATURES, load_catalogue
from zdoctor.symptoms.extract import recognise

LAYERS_DIR = REPO / "zdoctor" / "layers"


def layer_files() -> dict[str, Path]:
    """Each node layer that has known messages -> its file."""
    return {layer.id: LAYERS_DIR / layer.package / LAYER_FILE for layer in LAYERS
            if (LAYERS_DIR / layer.package / LAYER_FILE).is_file()}


def copied_layers(tmp_path: Path) -> Path:
    """A copy of every layer's file, laid out as ``zdoctor/layers`` is."""
    root = tmp_path / "layers"
    for path in layer_files().values():
        (root / path.parent.name).mkdir(parents=True)
        shutil.copy(path, root / path.parent.name / LAYER_FILE)
    return root


def test_every_entry_s_layer_is_the_layers_key_of_the_folder_that_holds_it():
    files = layer_files()
    assert len(files) >= 10
    held = {}
    for layer, path in files.items():
        for raw in load_toml_file(path)["signature"]:
            assert raw["id"] not in held, raw["id"]
            held[raw["id"]] = layer
    assert {s.id: s.layer for s in SIGNATURES} == held
    assert all(s.layer in BY_ID for s in SIGNATURES)
    # no layer word of its own: the folder decides, so no entry spells one
    assert not any("layer" in raw for path in files.values() for raw in load_toml_file(path)["signature"])


def test_an_entry_a_check_confirms_lives_in_the_layer_of_one_of_those_checks():
    load_vocabulary()
    for s in SIGNATURES:
        if s.confirm:
            assert s.layer in {CHECKS[c].layer for c in s.confirm}, (s.id, s.layer, s.confirm)


def test_order_alone_decides_which_entry_names_a_line_across_the_layers_files():
    """The libraries' file is read before CUDA lookup's and the toolchain's, yet CUDA lookup's specific
    entries are tried first, as ORDER lists them."""
    assert [s.id for s in SIGNATURES] == list(ORDER)
    lines = {
        "ImportError: /env/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister":
            ("loader.undefined-nccl-symbol", "cuda-lookup"),
        "ImportError: /env/ops/cpu_adam.so: undefined symbol: _ZN3c105ErrorC2E":
            ("loader.undefined-symbol", "libraries"),
        "/usr/bin/ld: cannot find -lcuda: No such file or directory": ("link.cannot-find-lcuda", "cuda-lookup"),
        "/usr/bin/ld: cannot find -laio: No such file or directory": ("link.cannot-find-lib", "toolchain"),
    }
    for line, (sid, layer) in lines.items():
        hit = recognise(line)
        assert hit is not None and (hit[0].id, hit[0].layer) == (sid, layer), line
    assert ORDER.index("loader.undefined-nccl-symbol") < ORDER.index("loader.undefined-symbol")
    assert ORDER.index("link.cannot-find-lcuda") < ORDER.index("link.cannot-find-lib")


def test_a_copy_of_the_layers_files_loads_to_the_same_catalogue(tmp_path):
    assert load_catalogue(copied_layers(tmp_path)) == SIGNATURES


def remove_entry(path: Path, sid: str) -> str:
    """Cut entry ``sid`` out of the TOML file ``path``; returns its text."""
    text = path.read_text(encoding="utf-8")
    blocks = text.split("\n\n[[signature]]\n")
    (block,) = [b for b in blocks if f'\nid = "{sid}"\n' in "\n" + b + "\n"]
    path.write_text(text.replace("\n\n[[signature]]\n" + block, ""), encoding="utf-8")
    return "[[signature]]\n" + block


def test_the_loader_refuses_broken_data_in_one_line_naming_the_file_and_entry(tmp_path):
    root = copied_layers(tmp_path)
    launch = root / "launch" / LAYER_FILE
    entry = remove_entry(launch, "ssh.resolve")
    with pytest.raises(InputError, match=r"ssh\.resolve is in no layer's symptoms\.toml"):
        load_catalogue(root)
    with pytest.raises(InputError, match=r"c10d\.port-in-use \(launch\) is not in ORDER"):
        load_catalogue(root, order=tuple(i for i in ORDER if i not in ("ssh.resolve", "c10d.port-in-use")))
    with pytest.raises(InputError, match=r"kernel\.xid is listed twice"):
        load_catalogue(root, order=tuple(i for i in ORDER if i != "ssh.resolve") + ("kernel.xid",))
    # the same entry in two layers' files
    nccl = root / "nccl_network" / LAYER_FILE
    nccl.write_text(nccl.read_text(encoding="utf-8") + "\n" + entry, encoding="utf-8")
    launch.write_text(launch.read_text(encoding="utf-8") + "\n" + entry, encoding="utf-8")
    with pytest.raises(InputError, match=r"launch/symptoms\.toml: entry 'ssh\.resolve' is also in the layer "
                                         r"nccl-network"):
        load_catalogue(root)
    nccl.write_text(nccl.read_text(encoding="utf-8").replace(entry, "").rstrip() + "\n", encoding="utf-8")
    assert load_catalogue(root) == SIGNATURES
    # a key of its own, a pattern that does not compile, a malformed file
    for broken, message in ((entry.replace('kind = "', 'layer = "launcher"\nkind = "'), "unknown layer"),
                            (entry.replace("pattern = '", "pattern = '(?P<x"), "the pattern does not compile"),
                            (entry.replace('kind = "host-unresolved"', "kind = "), "invalid TOML")):
        launch.write_text(launch.read_text(encoding="utf-8").replace(entry, broken), encoding="utf-8")
        with pytest.raises(InputError) as err:
            load_catalogue(root)
        assert message in str(err.value) and str(launch) in str(err.value) and "\n" not in str(err.value)
        launch.write_text(launch.read_text(encoding="utf-8").replace(broken, entry), encoding="utf-8")
    assert load_catalogue(root) == SIGNATURES
