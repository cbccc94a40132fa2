"""The message sites of a module are found by a visitor that skips the nodes no site can be inside (constants,
names, operators): what it finds, in the order it finds it, is what the standard full traversal finds, on
real modules (the standard library's and zdoctor's own) and on one built to nest sites in odd places."""

from __future__ import annotations

import ast
import logging
import sysconfig
from pathlib import Path

from conftest import REPO

from zdoctor.symptoms import origin_templates as ot

NESTED = '''
import logging
logger = logging.getLogger(__name__)

class Settings(BaseModel):
    def check(self):
        if self.size > 4:
            run(lambda: logger.warning("size %s is over the limit", self.size))
        else:
            raise ValueError(f"size {self.size} is too small for {NAME}")
        assert self.mode in MODES, "mode must be one of the known modes"

def outer(x):
    if x:
        def inner():
            raise RuntimeError("an inner failure is not guarded by the outer if")
        return [logger.error("listed error message here %d" % i) for i in range(x)]
'''


class FullTraversal(ot._Sites):
    """The same site rules, visited by :class:`ast.NodeVisitor`'s own full traversal."""

    visit = ast.NodeVisitor.visit  # type: ignore[assignment]
    generic_visit = ast.NodeVisitor.generic_visit  # type: ignore[assignment]


def sites_by(visitor: type[ot._Sites], source: str) -> list[dict]:
    v = visitor(source)
    v.visit(ast.parse(source))
    return v.sites


def test_the_nested_sites_are_found_with_their_guards():
    found = ot.python_sites(NESTED)[0]
    assert [(s["kind"], s["guard"]) for s in found] == [
        ("logger.warning", "self.size > 4"),
        ("raise ValueError", "not (self.size > 4)"),
        ("assert", "self.mode in MODES"),
        ("raise RuntimeError", ""),
        ("logger.error", "x"),
    ]
    assert found == sites_by(FullTraversal, NESTED)


def test_real_modules_give_the_same_sites_as_the_full_traversal():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = [*sorted((REPO / "zdoctor").rglob("*.py")), *sorted(Path(logging.__file__).parent.glob("*.py")),
             *(stdlib / name for name in ("argparse.py", "subprocess.py", "tarfile.py", "shutil.py"))]
    total = 0
    for path in paths:
        source = path.read_text(encoding="utf-8")
        fast = sites_by(ot._Sites, source)
        assert fast == sites_by(FullTraversal, source), path
        total += len(fast)
    assert total > 100  # the comparison saw real sites, not only empty lists
