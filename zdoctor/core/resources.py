"""Find the data that ships with zdoctor: playbooks, assets, the Textual screens and the node layers' data
files (``layers/<layer>/*.toml``).

In an installed wheel they live inside the package (``zdoctor/playbooks`` ...); in a source
checkout they sit beside it at the top level. In the one-file bundle (``zdoctor.pyz``) the package is
imported from the zip and its data is extracted to a per-user cache, which the bundle's bootstrap names
in :data:`DATA_ROOT`.
"""

from __future__ import annotations

from pathlib import Path

#: Set by the bundle's bootstrap: the directory that holds the extracted ``playbooks``, ``assets`` and
#: ``layers`` data.
DATA_ROOT: Path | None = None
#: Set by the bundle's bootstrap: the zdoctor.pyz this process runs from (what ``fleet --push`` copies).
BUNDLE: Path | None = None


def data_dir(name: str) -> Path:
    """The directory of bundled data ``name`` ("playbooks", "assets", "screens" or "layers")."""
    pkg = Path(__file__).resolve().parent.parent
    roots = ([DATA_ROOT] if DATA_ROOT is not None else []) + [pkg, pkg.parent]
    for root in roots:
        cand = root / name
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"bundled data directory {name!r} is missing from this installation")
