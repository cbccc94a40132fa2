"""The guided session: start screen, playbook walk, evidence, remedies, export, resume and learn mode.

The UI renders engine state and posts intents; every diagnostic decision is the engine's
(:class:`zdoctor.walk.engine.Walk`, :func:`zdoctor.walk.doctor.check`). ``make_app`` is the one factory the
command line and the tests use.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from zdoctor.core.errors import InputError, ZdoctorError

from .base import CTRL_C_QUITS, HELP, QUIT, AppBase
from .common import SCREENS_CSS, START_CSS


@dataclass
class Context:
    """What a screen works on: a host, the session log its steps go to, and how it came about."""

    host: Any
    mode: str  # "tui" (this node), "demo" (a practice scenario), or the mode of a resumed session
    log: Any = None  # zdoctor.walk.session.SessionLog | None
    scenario: Any = None  # zdoctor.walk.practice.Scenario | None
    note: str = ""  # why the session is not recorded, when it is not
    #: Opens the session log later (:meth:`open_log`): a first screen is drawn before the log's modules load.
    opener: Callable[[], tuple[Any, str]] | None = None
    #: What was recorded before the log was opened, written to it when it is.
    pending: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def practice(self) -> bool:
        return self.scenario is not None

    def record(self, type_: str, data: dict[str, Any]) -> None:
        """Append to the session log (kept until it is opened); a log that cannot be written is dropped,
        never fatal."""
        with self._lock:
            if self.opener is not None:
                self.pending.append((type_, data))
                return
            if self.log is None:
                return
            try:
                self.log.record(type_, data)
            except (OSError, ZdoctorError, ValueError) as exc:
                self.note = f"the session log stopped: {exc}"
                self.log = None

    def open_log(self) -> str:
        """Open the session log of a context made with an ``opener``, and write what was recorded meanwhile;
        returns why the session is not recorded, or ``""``. Once only: later calls change nothing."""
        with self._lock:
            opener, self.opener = self.opener, None
            if opener is None:
                return ""
            self.log, self.note = opener()
            pending, self.pending = self.pending, []
            for type_, data in pending:
                self.record(type_, data)
            return self.note

    def close(self, code: int = 0) -> None:
        if self.pending:
            self.open_log()  # what was recorded before a quick quit is not lost
        if self.log is not None:
            with contextlib.suppress(OSError, ZdoctorError):
                self.log.close(code)


def open_log(mode: str, argv: list[str], info: dict[str, Any]) -> tuple[Any, str]:
    """A new session log, or None and the reason it could not be created."""
    from zdoctor.walk.session import SessionLog

    try:
        return SessionLog.create(mode, argv, info), ""
    except (OSError, ZdoctorError) as exc:
        return None, f"session not recorded: {exc}"


def new_walk(playbook_id: str, host: Any, record: Any) -> Any:
    """A walk of a bundled playbook (the checks and predicates it judges by load with its first step)."""
    from zdoctor.walk.engine import Walk
    from zdoctor.walk.playbook import load_bundled

    return Walk(load_bundled(playbook_id), host, record=record)


def practice_context(scenario: Any, argv: list[str], *, log_now: bool = True) -> Context:
    """A context replaying ``scenario``, recorded as a ``demo`` session; without ``log_now`` its session log
    is opened later (:meth:`Context.open_log`)."""
    host = scenario.host()
    ctx = Context(host=host, mode="demo", scenario=scenario,
                  opener=partial(open_log, "demo", argv, {**host.info, "scenario": scenario.id}))
    if log_now:
        ctx.open_log()
    return ctx


class ZdoctorApp(AppBase):
    """The zdoctor terminal UI."""

    TITLE = "zdoctor"
    SUB_TITLE = "ZeRO-3 Offload node doctor"
    #: the start screen's stylesheet, read with the app: Textual reads none for an app's default screen
    CSS_PATH = START_CSS
    BINDINGS = [
        HELP,
        Binding("t", "glossary", "Terms", id="glossary"),
        Binding("x", "export_dialog", "Export", id="export"),
        QUIT,
        CTRL_C_QUITS,
    ]

    def __init__(self, python: str | None = None, argv: list[str] | None = None, host: Any = None, *,
                 resume: str | None = None, demo: str | None = None, export_dir: str | os.PathLike[str] | None = None,
                 plan: dict[str, Any] | None = None) -> None:
        first_walk = plan is not None and plan.get("demo") is not None  # a walk is the first screen
        # Textual reads an app's stylesheet, never its default screen's own: the first screen's, read here
        super().__init__(css_path=SCREENS_CSS if first_walk else None)
        self.python = python
        self.argv = list(argv or [])
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self.plan = plan or {}
        self._host = host
        self.contexts: list[Context] = []
        self.ctx: Context | None = None

    # -- start-up ----------------------------------------------------------------------------------
    def live_context(self, *, log_now: bool = True) -> Context:
        """This node's context; without ``log_now`` its session log is opened later (:meth:`open_live_log`)."""
        from zdoctor.host import LiveHost

        host = self._host if self._host is not None else LiveHost(python=self.python)
        ctx = Context(host=host, mode="tui", opener=lambda: open_log("tui", self.argv, host.info))
        if log_now:
            ctx.open_log()
        return ctx

    def open_later_log(self, ctx: Context) -> None:
        """Open the session log of a context made without one; say so when it cannot be."""
        if ctx.open_log():
            self.notify(ctx.note, severity="warning")

    def add_context(self, ctx: Context) -> Context:
        self.contexts.append(ctx)
        self.ctx = ctx
        return ctx

    def get_default_screen(self) -> Screen:
        """The first screen, drawn as the app's default screen (pushing it over Textual's blank default screen
        would style and lay out both before the first frame): this node's start screen, or the first step of
        ``--demo SCENARIO``'s walk; a resumed session or the list of scenarios is pushed over the blank one in
        :meth:`on_mount`."""
        if "resume" in self.plan or ("demo" in self.plan and self.plan["demo"] is None):
            return super().get_default_screen()
        if "demo" in self.plan:  # a practice walk of one scenario: its first step is the first screen
            from .walk import WalkScreen

            scenario = self.plan["demo"]
            ctx = self.add_context(practice_context(scenario, self.argv, log_now=False))
            return WalkScreen(ctx, new_walk(scenario.playbook, ctx.host, ctx.record))
        from .start import StartScreen  # only the first screen's module is imported before it is drawn

        # the session log (and the walk's event vocabulary it loads) once the start screen is drawn
        return StartScreen(self.add_context(self.live_context(log_now=False)))

    def can_go_back(self) -> bool:
        """Whether the screen under the current one is one to go back to: not Textual's blank default, nor a
        first screen that was left (a ``--demo SCENARIO`` walk)."""
        if len(self.screen_stack) < 2:
            return False
        under = self.screen_stack[-2]
        return under.id != "_default" and not getattr(under, "left", False)

    def on_mount(self) -> None:
        # only the first screen's module is imported before it is drawn
        if "resume" in self.plan:
            from .walk import WalkScreen

            ctx, walk = self.plan["resume"]
            self.add_context(ctx)
            self.push_screen(WalkScreen(ctx, walk, resumed=True))
            self.notify(f"resumed session {ctx.log.id if ctx.log else ''} at {walk.current}", timeout=4)
        elif "demo" in self.plan and self.plan["demo"] is None:
            from .practice import PracticeScreen

            self.push_screen(PracticeScreen())
        if self.ctx is not None and self.ctx.note:
            self.notify(self.ctx.note, severity="warning")

    def base_screen(self, ctx: Context | None) -> Screen:
        """What Esc leads back to from a walk that was opened first: the practice list, or the start."""
        from .practice import PracticeScreen
        from .start import StartScreen

        if ctx is not None and ctx.practice:
            return PracticeScreen(selected=ctx.scenario.id)
        live = next((c for c in self.contexts if c.mode == "tui" and not c.practice and c is not ctx), None)
        return StartScreen(live or ctx or self.add_context(self.live_context()))

    def start_practice(self, scenario: Any) -> None:
        """Replay ``scenario`` and walk its playbook."""
        from .walk import WalkScreen

        ctx = self.add_context(practice_context(scenario, self.argv))
        self.push_screen(WalkScreen(ctx, new_walk(scenario.playbook, ctx.host, ctx.record)))

    def start_walk(self, ctx: Context, playbook_id: str) -> None:
        from .walk import WalkScreen

        self.ctx = ctx
        self.push_screen(WalkScreen(ctx, new_walk(playbook_id, ctx.host, ctx.record)))

    def resume_session(self, session_id: str | None) -> None:
        """Pick up a recorded session from the start screen (the same path as ``--resume``)."""
        from .walk import WalkScreen

        try:
            ctx, walk = prepare_resume(session_id or "", self.argv)
        except ZdoctorError as exc:
            self.notify(str(exc), severity="error")
            return
        self.add_context(ctx)
        self.push_screen(WalkScreen(ctx, walk, resumed=True))

    async def action_quit(self) -> None:
        """Quit; while a remedy runs, only when asked twice, and its commands are cancelled first."""
        running = [s.running for s in self.screen_stack if getattr(s, "running", None) is not None]
        if running and not getattr(self, "_quit_warned", False):
            self._quit_warned = True
            self.notify("A remedy is running: q (or Ctrl-C) again cancels it and quits.", severity="warning")
            return
        for event in running:
            event.set()
        await super().action_quit()

    # -- export ------------------------------------------------------------------------------------
    def export(self, fmt: str) -> Path:
        """Write the current session as ``fmt`` (md, html, json); returns the path written."""
        from zdoctor.report.export import export_session
        from zdoctor.walk.events import ExportWritten

        ctx = self.ctx
        if ctx is None or ctx.log is None:
            raise InputError("this session is not recorded, so there is nothing to export"
                             + (f" ({ctx.note})" if ctx is not None and ctx.note else ""))
        path = export_session(ctx.log.id, fmt, self.export_dir, live=True)
        ExportWritten(format=fmt, path=str(path)).record(ctx.record)
        return path

    def export_now(self, fmt: str) -> None:
        try:
            path = self.export(fmt)
        except ZdoctorError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.notify(f"exported to {path}", title="Export", timeout=8)

    def action_export_dialog(self) -> None:
        from .info import ExportScreen

        if not isinstance(self.screen, ExportScreen):
            self.push_screen(ExportScreen())

    # -- help, glossary, palette -------------------------------------------------------------------
    def action_glossary(self, term: str | None = None) -> None:
        from .info import GlossaryScreen

        if not isinstance(self.screen, GlossaryScreen):
            self.push_screen(GlossaryScreen(term))

    def action_practice(self) -> None:
        from .practice import PracticeScreen

        if not isinstance(self.screen, PracticeScreen):
            self.push_screen(PracticeScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every key's action, named after its screen, plus exports and learn mode."""
        for fmt, label in (("md", "Markdown"), ("html", "HTML"), ("json", "JSON")):
            yield SystemCommand(f"Export: {label}", f"Write this session as {label} (path shown when done)",
                                partial(self.export_now, fmt))
        yield SystemCommand("Help: keys", "Every key of this screen and the app (? or F1)", self.action_help)
        yield SystemCommand("Learn: glossary", "RPATH, RUNPATH, GLIBCXX, SONAME, ZeRO, offload ... (t)",
                            self.action_glossary)
        yield SystemCommand("Learn: practice scenarios", "Replay a recorded broken node, step by step",
                            self.action_practice)
        where = getattr(screen, "PALETTE_GROUP", type(screen).__name__)
        seen = {"help", "glossary", "export_dialog", "quit", "command_palette"}
        for node, binding, _enabled, _tip in screen.active_bindings.values():
            if node is self or binding.action in seen or not binding.description:
                continue
            seen.add(binding.action)
            yield SystemCommand(f"{where}: {binding.description}",
                                f"key {self.get_key_display(binding)}",
                                partial(self.call_later, screen.run_action, binding.action))
        yield from super().get_system_commands(screen)

    def on_unmount(self) -> None:
        for ctx in self.contexts:
            ctx.close(0)


# --- resume and demo, resolved before the terminal is taken over -------------------------------------

def prepare_resume(session: str, argv: list[str]) -> tuple[Context, Any]:
    """Reopen a recorded guided session: its host (recorded results first), its log, its walk."""
    from zdoctor.core.registry import load_vocabulary
    from zdoctor.walk.resume import SessionHost, find_point, rebuild_host, recorded_results, resume_walk
    from zdoctor.walk.session import SessionLog

    load_vocabulary()
    point = find_point(session or None)
    host = SessionHost(rebuild_host(point.host_info), recorded_results(point.events))
    scenario = None
    if point.host_info.get("scenario"):
        from zdoctor.walk.practice import get_scenario

        scenario = get_scenario(str(point.host_info["scenario"]))
    log = SessionLog.reopen(point.session_id, argv=argv)
    ctx = Context(host=host, mode=point.mode or "tui", log=log, scenario=scenario)
    walk = resume_walk(point, host, record=ctx.record)
    return ctx, walk


def make_app(python: str | None = None, argv: list[str] | None = None, host: Any = None, *,
             resume: str | None = None, demo: str | None = None,
             export_dir: str | os.PathLike[str] | None = None) -> ZdoctorApp:
    """The one factory the CLI and the tests use.

    ``host``: a replayed snapshot instead of this node. ``resume``: ``""`` (newest) or a session id.
    ``demo``: ``""`` (choose a scenario) or a scenario id. Problems raise before anything is drawn.
    """
    argv = list(argv or [])
    plan: dict[str, Any] = {}
    if resume is not None:
        plan["resume"] = prepare_resume(resume, argv)
    elif demo is not None:
        from zdoctor.walk.practice import get_scenario

        plan["demo"] = get_scenario(demo) if demo else None
    return ZdoctorApp(python=python, argv=argv, host=host, plan=plan, export_dir=export_dir)
