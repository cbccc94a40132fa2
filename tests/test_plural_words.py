"""Counted words agree with their number everywhere: no "1 line(s)" or "1 director(ies)" in what zdoctor
writes, one plural helper (zdoctor/core/plural.py) for every count word."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from zdoctor.core.plural import count_of, noun_for

ROOT = Path(__file__).resolve().parent.parent

#: Messages other programs print, quoted as they print them (zdoctor matches them; it does not word them).
QUOTED = ("unable to compile CUDA op(s)", "CUDA-capable device(s) is/are busy", "oom-kill event(s) in %ps cgroup")

HEDGED = re.compile(r"[A-Za-z]\((?:s|es|ies)\)")


def _hedged_strings(path: Path) -> list[str]:
    """The string literals of ``path`` (f-string parts too, not docstrings) with a word written as "(s)"."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [f"{path}:{n.lineno}: {n.value}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and HEDGED.search(n.value) and not any(q in n.value for q in QUOTED)]


def test_no_count_word_is_hedged_in_the_code():
    files = sorted([*(ROOT / "zdoctor").rglob("*.py"), *(ROOT / "screens").rglob("*.py")])
    assert len(files) > 50
    found = [hit for f in files for hit in _hedged_strings(f)]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_hedged_word(tmp_path: Path):
    bad = tmp_path / "hedged.py"
    bad.write_text('"""A docstring may say line(s)."""\nn = 1\nTEXT = f"{n} director(ies) and {n} line(s)"\n'
                   'QUOTE = "CUDA_HOME does not exist, unable to compile CUDA op(s)"\n')
    assert [h.split(":", 2)[1:] for h in _hedged_strings(bad)] == [["3", "  director(ies) and "], ["3", "  line(s)"]]


def test_the_helper_words_one_and_many():
    assert [count_of(1, "directory", "directories"), count_of(2, "directory", "directories"), count_of(0, "line"),
            count_of(2, "peer address")] == ["1 directory", "2 directories", "0 lines", "2 peer addresses"]
    assert [noun_for(1, "key"), noun_for(3, "key"), noun_for(1, "is", "are"), noun_for(2, "is", "are")] == [
        "key", "keys", "is", "are"]
