"""The ds_config reader against DeepSpeed's real one (hjson with the duplicate-key hook), its error lines,
positions, the NVMe patch and its careful application."""

from __future__ import annotations

import codecs
import json
import os
import shutil
import stat
import subprocess
import tempfile

import pytest
from conftest import FIXTURES
from dsenv import ensure

from zdoctor.core.errors import InputError
from zdoctor.layers.offload.dsconfig import MAX_BYTES, load_config, parse_config
from zdoctor.layers.offload.dspatch import apply_config_patch, nvme_patch
from zdoctor.layers.offload.hjsonreader import DuplicateKeyError, ParseError, line_col, parse_text

OFF = FIXTURES / "offload"

#: Inputs where HJSON's rules bite: optional commas, quoteless strings to the end of the line, comments,
#: root objects without braces, multiline strings, duplicates, and the errors of each.
CORPUS = [
    '{"a": 1, "b": [1, 2, {"c": null}], "d": "x"}',
    '{"a": 5e8, "b": 1.5, "c": -3, "d": 1e10, "e": 2.0, "f": 1e9}',
    '{\n  "a": 1\n  "b": 2\n}',
    '{"a": 1,}',
    '{\n  # comment\n  a: 1 // c\n  /* block */ b: hello world\n  c: "q"\n}',
    "a: 1\nb: 2\n",
    '{"a": 1 "b": 2}',
    '{"device": "cpu" "pin_memory": true}',
    '{"offload": {device: cpu, pin_memory: false}}',
    '{"a": 1, "a": 2}',
    '{"z": {"a": 1, "b": 2, "a": 3}}',
    '{"a": 1, "b": 2, "b": 3, "a": 4}',
    '{"a": tru}',
    '{"a": }',
    '{"a": 1',
    '{"a": [1, 2}',
    '{"a": "unterminated}',
    '{"a": "bad \\q escape"}',
    '{"a": "\\u00e9\\ud83d\\ude00"}',
    "{'a': 'single'}",
    "{\n  a:\n    '''\n    line one\n    line two\n    '''\n}",
    "[1, 2, 3]",
    "3",
    "",
    "   # only a comment\n",
    '{"a": 1} extra',
    '{"a b": 1, a b: 2}',
    "{\n  a b: 1\n}",
    '\ufeff{"a": 1}',
    '{"a": true, "b": false, "c": null, "d": truex}',
    '{\n "x": 1.0e-3,\n "y": -0.5,\n "z": 01\n}',
    '{"a": {"b": {"c": {}}}, "d": []}',
    '{"a": "line\nbreak"}',
    "{: 1}",
    '{"a": 1}}',
    '{\r\n  "a": 1\r\n}\r\n',
    '{"a": 1e400}',
]

HJSON_PROBE = r"""
import json, sys, hjson
from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
out = []
for s in json.load(sys.stdin):
    try:
        out.append({"ok": True, "value": hjson.loads(s, object_pairs_hook=dict_raise_error_on_duplicate_keys)})
    except hjson.HjsonDecodeError as e:
        out.append({"ok": False, "line": e.lineno, "col": e.colno})
    except ValueError as e:
        out.append({"ok": False, "dup": str(e)})
    except Exception as e:
        out.append({"ok": False, "crash": type(e).__name__})
sys.stdout.write("@@R@@" + json.dumps(out))
"""


def mine(text: str) -> dict:
    try:
        value, _spans = parse_text(text)
    except DuplicateKeyError as exc:
        return {"ok": False, "dup": exc.msg}
    except ParseError as exc:
        line, col = line_col(text, exc.pos)
        return {"ok": False, "line": line, "col": col}
    return {"ok": True, "value": json.loads(json.dumps(value))}


def test_reads_like_deepspeed_over_a_corpus_and_the_fixtures():
    """Every value, every error position and every duplicate-key message equals DeepSpeed's own reader."""
    texts = CORPUS + [p.read_text(encoding="utf-8") for p in sorted(OFF.glob("*json"))]
    proc = subprocess.run([str(ensure()), "-c", HJSON_PROBE], input=json.dumps(texts), capture_output=True,
                          text=True, timeout=300)
    ref = json.loads(proc.stdout.split("@@R@@", 1)[1])
    assert len(ref) == len(texts)
    for text, want in zip(texts, ref):
        got = mine(text)
        if "crash" in want:  # hjson itself dies (OverflowError on 1e400): zdoctor reports an error instead
            assert got["ok"] is False, text
            continue
        assert got == want, text


def test_positions_of_values():
    cfg = load_config(str(OFF / "zero3-nvme-offload.json"))
    assert cfg.pos(("zero_optimization", "offload_optimizer", "nvme_path")) == (18, 20)
    assert cfg.pos(("aio", "thread_count")) == (35, 21)
    assert cfg.where(("zero_optimization", "stage")).endswith("zero3-nvme-offload.json:8:14")
    assert cfg.pos(("zero_optimization", "offload_param", "missing")) is None
    assert cfg.get(("zero_optimization", "offload_param", "buffer_size")) == 1e8
    assert cfg.syntax == "json" and cfg.json_error is None


def test_hjson_file_is_valid_for_deepspeed_but_not_strict_json():
    cfg = load_config(str(OFF / "zero3-comments.hjson"))
    assert cfg.syntax == "hjson"
    assert cfg.json_error == "1:1: Expecting value"
    assert cfg.data["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert cfg.pos(("zero_optimization", "offload_optimizer", "device")) == (11, 15)


def test_duplicate_key_names_both_places():
    with pytest.raises(InputError) as err:
        load_config(str(OFF / "broken-duplicate.json"))
    msg = str(err.value)
    assert msg.startswith(f"{OFF / 'broken-duplicate.json'}:8:5: duplicate key \"stage\" in zero_optimization "
                          "(first at line 4)")
    assert msg.endswith("Duplicate keys in DeepSpeed config: ['stage']")
    assert "\n" not in msg


def test_malformed_json_gives_one_line_with_the_position():
    with pytest.raises(InputError) as err:
        load_config(str(OFF / "broken-truncated.json"))
    assert str(err.value) == (f"{OFF / 'broken-truncated.json'}:7:1: malformed config: Bad key name (eof) "
                              "(DeepSpeed's HJSON reader; strict JSON readers fail too: line 7 column 1: Expecting "
                              "property name enclosed in double quotes)")


@pytest.mark.parametrize("text, expect", [
    ("[1, 2]", "the config is an array, not an object"),
    ('"just a string"', "the config is a string, not an object"),
    ("{\"a\": 1e400}", "number 1e400 is out of range"),
    ("{\"a\": \"x\" /* open comment", "Unterminated /* comment"),
])
def test_bad_documents(tmp_path, expect, text):
    p = tmp_path / "ds.json"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_config(str(p))
    assert expect in str(err.value) and str(err.value).startswith(str(p))


def test_file_problems_are_one_line_errors(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(InputError, match="no such ds_config"):
        load_config(str(missing))
    with pytest.raises(InputError, match="is a directory"):
        load_config(str(tmp_path))
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_BYTES + 1)  # sparse: nothing is really written
    with pytest.raises(InputError, match="larger than the 16 MiB"):
        load_config(str(huge))
    latin = tmp_path / "latin1.json"
    latin.write_bytes(b'{\n  "name": "caf\xe9"\n}\n')
    with pytest.raises(InputError) as err:
        load_config(str(latin))
    assert str(err.value).startswith(f"{latin}:2:15: not UTF-8 (byte 0xe9 at offset 16)")
    binary = tmp_path / "bin.json"
    binary.write_bytes(b'{"a":\x00 1}')
    with pytest.raises(InputError, match=r":1:6: not a text file \(NUL byte at offset 5\)"):
        load_config(str(binary))
    empty = tmp_path / "empty.json"
    empty.write_text("", encoding="utf-8")
    assert load_config(str(empty)).data == {}  # hjson reads an empty file as {} and so does DeepSpeed


def as_other_user(func, *args) -> str:
    """Run ``func(*args)`` in a forked child as nobody (when root; as ourselves otherwise): its result (a
    string, or the repr of anything else) or ``"ExceptionType: message"``."""
    for codec in ("ascii", "utf-8", "latin-1"):  # the child may not be able to read the stdlib to import them
        codecs.lookup(codec)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            try:
                value = func(*args)
                out = value if isinstance(value, str) else repr(value)
            except Exception as exc:  # noqa: BLE001
                out = f"{type(exc).__name__}: {exc}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read().decode()
    os.waitpid(pid, 0)
    return data


def test_unreadable_file():
    d = tempfile.mkdtemp(prefix="zdoctor-ds-")  # reachable by every user, unlike pytest's tmp dirs
    try:
        os.chmod(d, 0o755)
        p = os.path.join(d, "secret.json")
        with open(p, "w", encoding="utf-8") as fh:
            fh.write("{}")
        os.chmod(p, 0)
        assert as_other_user(load_config, p) == f"InputError: {p}: permission denied"
    finally:
        shutil.rmtree(d)


# -- the NVMe patch --------------------------------------------------------------------------------------

def test_nvme_patch_changes_only_the_offload_blocks():
    src = OFF / "zero3-cpu-offload.json"
    cfg = load_config(str(src))
    patch = nvme_patch(cfg, "/mnt/nvme/offload", block_size=1048576)
    new = parse_config(patch.new_text)
    assert new.get(("zero_optimization", "offload_optimizer")) == {"device": "nvme", "nvme_path": "/mnt/nvme/offload"}
    assert new.get(("zero_optimization", "offload_param")) == {"device": "nvme", "nvme_path": "/mnt/nvme/offload"}
    assert new.get(("aio",)) == {"block_size": 1048576}
    old_lines = cfg.text.splitlines()
    kept = [ln for ln in old_lines if "offload" not in ln and '"device"' not in ln]
    new_lines = patch.new_text.splitlines()
    assert all(ln in new_lines for ln in kept)  # 1e9 stays 1e9, indentation stays
    assert '+      "device": "nvme",' in patch.diff and '-      "device": "cpu"' in patch.diff
    assert patch.changed == ["zero_optimization.offload_optimizer", "zero_optimization.offload_param",
                             "aio.block_size"]


def test_nvme_patch_keeps_comments_and_settings_of_an_hjson_file():
    cfg = load_config(str(OFF / "zero3-comments.hjson"))
    patch = nvme_patch(cfg, "/nvme")
    assert "// the optimizer lives in host memory" in patch.new_text
    assert "/* defaults otherwise */" in patch.new_text
    new = parse_config(patch.new_text)
    assert new.get(("zero_optimization", "offload_optimizer")) == {"device": "nvme", "nvme_path": "/nvme",
                                                                   "pin_memory": False}
    assert new.get(("zero_optimization", "offload_param", "device")) == "nvme"


def test_nvme_patch_inserts_missing_blocks_and_respects_the_stage():
    cfg = parse_config('{\n  "zero_optimization": {}\n}\n', "a.json")
    patch = nvme_patch(cfg, "/nvme")
    assert parse_config(patch.new_text).data == {"zero_optimization": {
        "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}  # stage 0/1/2: no parameter offload
    cfg = parse_config('{"zero_optimization": {"stage": 3, "offload_param": "auto"}}', "b.json")
    data = parse_config(nvme_patch(cfg, "/nvme").new_text).data["zero_optimization"]
    assert data["offload_param"] == {"device": "nvme", "nvme_path": "/nvme"}
    assert data["offload_optimizer"] == {"device": "nvme", "nvme_path": "/nvme"}
    with pytest.raises(InputError, match="no zero_optimization block"):
        nvme_patch(parse_config('{"train_batch_size": 8}'), "/nvme")


ZERO_PROBE = r"""
import json, sys
import hjson
from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
dev = lambda v: getattr(v, "value", v)
res = []
for path in sys.argv[1:]:
    d = hjson.load(open(path), object_pairs_hook=dict_raise_error_on_duplicate_keys)
    z = DeepSpeedZeroConfig(**d["zero_optimization"])
    res.append({"stage": int(z.stage), "opt": [dev(z.offload_optimizer.device), str(z.offload_optimizer.nvme_path)],
                "param": [dev(z.offload_param.device), str(z.offload_param.nvme_path)]})
sys.stdout.write("@@R@@" + json.dumps(res))
"""


def test_patched_configs_are_accepted_by_deepspeed(tmp_path):
    names = ("zero3-cpu-offload.json", "zero3-comments.hjson", "hf-zero3-auto.json")
    for name in names:
        (tmp_path / name).write_text(nvme_patch(load_config(str(OFF / name)), "/mnt/nvme").new_text, encoding="utf-8")
    proc = subprocess.run([str(ensure()), "-c", ZERO_PROBE, *(str(tmp_path / n) for n in names)],
                          capture_output=True, text=True, timeout=300)
    assert "@@R@@" in proc.stdout, proc.stderr[-2000:]
    for got in json.loads(proc.stdout.split("@@R@@", 1)[1]):
        assert got == {"stage": 3, "opt": ["nvme", "/mnt/nvme"], "param": ["nvme", "/mnt/nvme"]}


def test_apply_config_patch_backs_up_writes_and_validates(tmp_path):
    path = tmp_path / "ds.json"
    original = (OFF / "zero3-cpu-offload.json").read_bytes()
    path.write_bytes(original)
    path.chmod(0o640)
    new_text = nvme_patch(load_config(str(path)), "/mnt/nvme").new_text
    res = apply_config_patch(str(path), new_text)
    assert res == {"path": str(path), "backup": str(path) + ".bak", "written": True, "validated": True,
                   "rolled_back": False, "error": None}
    assert path.read_text(encoding="utf-8") == new_text
    assert (tmp_path / "ds.json.bak").read_bytes() == original
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    again = apply_config_patch(str(path), new_text)  # a second backup does not overwrite the first
    assert again["backup"] == str(path) + ".bak-2"


def test_apply_config_patch_refuses_a_broken_text_before_touching_anything(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 3}}', encoding="utf-8")
    with pytest.raises(InputError, match="malformed config"):
        apply_config_patch(str(path), '{"zero_optimization": {"stage": 3}')
    assert path.read_text(encoding="utf-8") == '{"zero_optimization": {"stage": 3}}'
    assert not (tmp_path / "ds.json.bak").exists()


def test_apply_config_patch_rolls_back_when_validation_fails(tmp_path):
    path = tmp_path / "ds.json"
    original = b'{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}\n'
    path.write_bytes(original)
    new_text = nvme_patch(load_config(str(path)), "/mnt/nvme").new_text
    seen = []

    def validate(cfg):
        seen.append(cfg.get(("zero_optimization", "offload_optimizer", "device")))
        raise ValueError("nvme_path is not mounted")

    res = apply_config_patch(str(path), new_text, validate=validate)
    assert seen == ["nvme"]  # the validator saw the new file, read back from disk
    assert res["written"] and res["rolled_back"] and not res["validated"]
    assert res["error"] == "nvme_path is not mounted"
    assert path.read_bytes() == original
    assert (tmp_path / "ds.json.bak").read_bytes() == original


def test_a_config_of_several_mebibytes_is_applied_through_the_core_not_argv(tmp_path):
    """A 7.9 MB ds_config (a config with a long embedded comment, within the 16 MiB the preview reads) is
    patched for real through the guide's apply path: the new text reaches the safe core in a file of a
    private folder, not as arguments (all of argv fits in about 2 MiB: E2BIG), and that folder is gone
    after."""
    from zdoctor.layers.offload.check_offload import nvme_patch_remedy
    from zdoctor.walk import apply

    base = json.loads((FIXTURES / "offload" / "zero3-cpu-offload.json").read_text())
    base["comment"] = "x" * (7_900_000)
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps(base, indent=2))
    remedy = nvme_patch_remedy(str(cfg), "/mnt/nvme")
    assert remedy is not None and len(remedy.action["text"]) > 7_800_000
    before = set(os.listdir(tempfile.gettempdir()))
    out = apply.run_remedy(remedy, dict(os.environ))
    assert out.exit_code == 0, out.output[-2000:] + str(out.error)
    patched = json.loads(cfg.read_text())
    assert patched["zero_optimization"]["offload_param"]["device"] == "nvme"
    assert patched["comment"] == base["comment"]
    assert {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("zdoctor-text-")} == set()


def test_the_core_refuses_a_text_file_that_is_not_the_one_shown(tmp_path):
    from zdoctor.edit import core_apply

    cfg = tmp_path / "ds_config.json"
    cfg.write_text("{}\n")
    import hashlib

    action = {"path": str(cfg), "sha256": hashlib.sha256(b"{}\n").hexdigest(), "backup": str(tmp_path / "bak"),
              "text": '{"a": 1}\n'}
    with core_apply.action_argv(action) as argv:
        text_file = argv[argv.index("--text-file") + 1]
        os.chmod(text_file, 0o600)
        with open(text_file, "w") as fh:  # swapped after it was staged
            fh.write('{"evil": 1}\n')
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "SHA-256 differs" in proc.stdout
    assert cfg.read_text() == "{}\n"
