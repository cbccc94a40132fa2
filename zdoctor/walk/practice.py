"""Practice scenarios for learn mode (``zdoctor --demo``): recorded snapshots of broken nodes, replayed.

The catalogue is ``assets/scenarios/index.toml``; each ``[[scenario]]`` names a snapshot file beside it
and the playbook to walk. Adding a scenario is a snapshot file and one entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from zdoctor.core.errors import InputError, UsageError
from zdoctor.core.resources import data_dir
from zdoctor.core.tomlfile import load_toml_file
from zdoctor.host import ReplayHost

INDEX = "index.toml"
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
REQUIRED = ("id", "title", "summary", "story", "snapshot", "playbook")


@dataclass(frozen=True)
class Scenario:
    """One practice scenario: a story, the snapshot it replays and the playbook it walks."""

    id: str
    title: str
    summary: str
    story: str
    snapshot: Path
    playbook: str
    part: int | None = None
    diagnosis: str | None = None
    terms: tuple[str, ...] = ()

    def host(self) -> ReplayHost:
        """A host answering from this scenario's snapshot."""
        return ReplayHost.load(str(self.snapshot))


def scenarios_dir() -> Path:
    """Where the bundled scenarios live."""

    return data_dir("assets") / "scenarios"


def load_scenarios(index: Path | None = None) -> list[Scenario]:
    """Every scenario in the catalogue, in file order; a malformed entry is an :class:`InputError`."""
    path = index or scenarios_dir() / INDEX
    data = load_toml_file(path)
    entries = data.get("scenario", [])
    if not isinstance(entries, list):
        raise InputError(f"{path}: `scenario` must be an array of tables ([[scenario]])")
    out: list[Scenario] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries, 1):
        where = f"{path}: scenario {i}"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: not a table")
        missing = [k for k in REQUIRED if not isinstance(entry.get(k), str) or not entry[k].strip()]
        if missing:
            raise InputError(f"{where}: missing or empty {', '.join(missing)}")
        sid = entry["id"]
        if not ID_RE.match(sid) or sid in seen:
            raise InputError(f"{where}: id {sid!r} is {'repeated' if sid in seen else 'not lowercase-with-dashes'}")
        seen.add(sid)
        snap = Path(entry["snapshot"])
        if snap.is_absolute() or ".." in snap.parts:
            raise InputError(f"{where}: snapshot must be a file name beside {INDEX}")
        part = entry.get("part")
        terms = entry.get("terms", [])
        if part is not None and (not isinstance(part, int) or isinstance(part, bool)):
            raise InputError(f"{where}: part must be an integer")
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
            raise InputError(f"{where}: terms must be an array of strings")
        out.append(Scenario(id=sid, title=entry["title"].strip(), summary=entry["summary"].strip(),
                            story=entry["story"].strip(), snapshot=path.parent / snap,
                            playbook=entry["playbook"], part=part, diagnosis=entry.get("diagnosis"),
                            terms=tuple(terms)))
    return out


def get_scenario(sid: str, scenarios: list[Scenario] | None = None) -> Scenario:
    """The scenario ``sid``; an unknown id is a :class:`UsageError` that lists the known ones."""
    known = load_scenarios() if scenarios is None else scenarios
    for s in known:
        if s.id == sid:
            return s
    raise UsageError(f"zdoctor: no practice scenario {sid!r} (known: {', '.join(s.id for s in known) or 'none'})")
