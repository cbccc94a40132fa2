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
from zdoctor.host import ReplayHost

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

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


def _toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> InputError:
    m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
    where = f"{path}:{m.group(1)}:{m.group(2)}" if m else str(path)
    msg = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(exc))
    return InputError(f"{where}: invalid TOML: {msg}")


def load_scenarios(index: Path | None = None) -> list[Scenario]:
    """Every scenario in the catalogue, in file order; a malformed entry is an :class:`InputError`."""
    path = index or scenarios_dir() / INDEX
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(path, exc) from None
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
