"""Find the data that ships with zdoctor: playbooks, assets and the Textual screens.

In an installed wheel they live inside the package (``zdoctor/playbooks`` ...); in a source
checkout they sit beside it at the top level. Both are found through importlib.resources.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def data_dir(name: str) -> Path:
    """The directory of bundled data ``name`` ("playbooks", "assets" or "screens")."""
    pkg = Path(str(resources.files("zdoctor")))
    for cand in (pkg / name, pkg.parent / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"bundled data directory {name!r} is missing from this installation")
