"""Pieces every screen uses: status marks, the key bar, probe progress (a finding, its evidence and its remedies
are drawn from the report document: :mod:`screens.docview`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from rich.segment import Segment
from rich.text import Text
from textual.dom import NoScreen
from textual.filter import LineFilter
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static

from zdoctor.core import progress
from zdoctor.core.model import CONTROL_CHARACTERS, ProbeResult
from zdoctor.core.present import MARKS as PRESENT_MARKS
from zdoctor.core.present import STYLES
from zdoctor.core.resources import data_dir

if TYPE_CHECKING:
    from zdoctor.host import Host

T = TypeVar("T")

#: Status marks: readable without colour (NO_COLOR) and in any 256-colour terminal.
MARKS = {**{s: (PRESENT_MARKS[s], STYLES[s].replace("bold ", "")) for s in PRESENT_MARKS},
         "timeout": ("⏱", "magenta")}
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
#: The start screen's stylesheet, and every other screen's. Each screen class names its own in ``CSS_PATH``,
#: which Textual reads when the first screen of that class opens: the start screen is drawn without waiting
#: for the rest to be parsed (Textual parses a stylesheet at about 0.1 ms a line).
START_CSS = str(data_dir("assets") / "start.tcss")
SCREENS_CSS = str(data_dir("assets") / "screens.tcss")
HOT = "⚠"


class NoControlCharacters(LineFilter):
    """Drop control characters from every line the app draws.

    Screens show text that came from the machine (command output, file names, a node's snapshot). Rich
    counts an escape or a bell as zero cells wide and passes it through, so such text could move the
    cursor, clear the screen or retitle the terminal. Dropping them keeps each line exactly as wide as it
    was laid out; the exports keep the text as it was.
    """

    def apply(self, segments: list[Segment], background: Any) -> list[Segment]:
        out = []
        for seg in segments:
            if seg.control is None and CONTROL_CHARACTERS.search(seg.text):
                seg = Segment(CONTROL_CHARACTERS.sub("", seg.text), seg.style)
            out.append(seg)
        return out


NO_CONTROL_CHARACTERS = NoControlCharacters()



def mark(status: str) -> Text:
    sym, style = MARKS.get(status, ("?", ""))
    return Text(sym, style=f"bold {style}")


async def in_thread(fn: Callable[..., T], *args: Any, name: str = "zdoctor") -> T:
    """Run ``fn`` in a daemon thread and await its result.

    Unlike a pooled worker thread, a daemon thread never holds up quitting: a probe stuck on a hung
    import cannot keep the user in the app.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not fut.done():
            setter(value)

    def target() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result = (fut.set_exception, exc)
        else:
            result = (fut.set_result, value)
        with contextlib.suppress(RuntimeError):  # the app has gone
            loop.call_soon_threadsafe(settle, *result)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await fut


# --- screens bound to a session ----------------------------------------------------------------

class ContextScreen(Screen[None]):
    """A screen working on one :class:`~screens.app.Context`; showing it makes that session current."""

    CSS_PATH = SCREENS_CSS

    def __init__(self, ctx: Any) -> None:
        super().__init__()
        self.ctx = ctx
        if getattr(ctx, "scenario", None) is not None:
            self.sub_title = f"practice: {ctx.scenario.id}"

    def on_screen_resume(self) -> None:
        self.app.ctx = self.ctx  # type: ignore[attr-defined]


# --- the key bar --------------------------------------------------------------------------------

class KeyBar(Static):
    """Every key of the current screen and the app, wrapped over as many lines as it takes."""

    DEFAULT_CSS = """
    KeyBar { dock: bottom; height: auto; padding: 0 1; background: $footer-background; }
    """

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._changed)
        self.show_keys()  # in the first frame; again once the screen's focus has settled its bindings
        self.call_after_refresh(self.show_keys)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _changed(self, screen: Screen) -> None:
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self.show_keys)

    def on_resize(self) -> None:
        self.show_keys()

    def entries(self) -> list[tuple[str, str, bool]]:
        """(key, description, enabled) of every shown binding: the screen's first, the app's last."""
        local, app = [], []
        seen: set[str] = set()
        for node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if not binding.show or not binding.description or binding.action in seen:
                continue
            seen.add(binding.action)
            item = (self.app.get_key_display(binding), binding.description, enabled)
            (app if node is self.app else local).append(item)
        return local + app

    def show_keys(self) -> None:
        if not self.is_attached or not self.is_mounted:
            return
        try:
            entries = self.entries()
        except NoScreen:  # the screen went away before the refresh
            return
        width = max(20, (self.size.width or self.app.size.width) - 2)
        out = Text()
        used = 0
        for key, desc, enabled in entries:
            piece = len(key) + 1 + len(desc)
            if used and used + 2 + piece > width:
                out.append("\n")
                used = 0
            elif used:
                out.append("  ")
                used += 2
            out.append(key, style="bold reverse" if enabled else "dim")
            out.append(" " + desc, style="" if enabled else "dim")
            used += piece
        self.update(out)


# --- probe progress -----------------------------------------------------------------------------

@dataclass
class ProbeState:
    name: str
    title: str
    budget: float | None
    started: float
    result: ProbeResult | None = None
    cancelled: bool = False


def probe_mark(status: str) -> Text:
    """A finished probe's mark: a dot for one that answered (a verdict's ✓ beside a ✗ finding read from its
    facts would contradict it), the status mark when it skipped, crashed or ran out of time."""
    from zdoctor.core.present import PROBE_ANSWERED

    return Text(PROBE_ANSWERED, style="dim") if status == "ok" else mark(status)


def probe_line(st: ProbeState, now: float, frame: int = 0) -> Text:
    """One probe: spinner and elapsed time while it runs, its status and recorded duration after."""
    line = Text()
    if st.result is None:
        elapsed = now - st.started
        over = st.budget is not None and elapsed > st.budget
        line.append(f" {SPINNER[frame % len(SPINNER)]} ", style="bold cyan")
        line.append(f"{st.name:<11}", style="bold")
        line.append(f" {st.title}")
        budget = f" of {st.budget:g} s" if st.budget else ""
        line.append(f"  {elapsed:5.1f} s{budget}", style="dim")
        what = progress.doing_now(st.name)
        if what:
            line.append(f"  {what}", style="cyan")
        if over:
            line.append(f"  past its {st.budget:g} s budget: c cancels it", style="bold yellow")
        return line
    res = st.result
    status = {"ok": "ok", "skip": "skip", "crash": "crash", "timeout": "timeout"}.get(res.status, "crash")
    line.append(" ")
    line.append_text(probe_mark(status))
    line.append(" ")
    line.append(f"{res.probe:<11}", style="bold")
    line.append(f" {st.title}")
    if st.cancelled:
        line.append(f"  cancelled after {res.duration_s:.1f} s", style="bold yellow")
    elif res.status == "ok":
        line.append(f"  {res.duration_s:.2f} s", style="dim")
    else:
        line.append(f"  {res.status}: {res.error or ''}", style="yellow")
    return line


def probe_done_text(st: ProbeState) -> Text:
    """A finished probe in a few words: mark, name, recorded duration or what went wrong."""
    res = st.result
    if res is None:
        return Text(st.name)
    status = res.status if res.status in MARKS else "crash"
    # one that answered goes unmarked: the dot would read as the list's separator
    out = Text(res.probe, style="bold") if status == "ok" else Text.assemble(mark(status), " ", (res.probe, "bold"))
    if st.cancelled:
        out.append(" cancelled", style="bold yellow")
    elif res.status == "ok":
        out.append(f" {res.duration_s:.2f} s", style="dim")
    else:
        out.append(f" {res.status}", style="yellow")
    return out


class ProbePanel(Static):
    """The probes of one step, each in its own thread, with a spinner and its elapsed time.

    Posts :class:`ProbePanel.Finished` when every probe has a result (or was cancelled).
    """

    class Finished(Message):
        def __init__(self, panel: ProbePanel) -> None:
            super().__init__()
            self.panel = panel

    def __init__(self, *, id: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("", id=id)
        self.clock = clock
        self.host: Host | None = None
        self.states: dict[str, ProbeState] = {}
        self._token = 0
        self._frame = 0
        self._timer: Any = None
        self._finished = False

    @property
    def running(self) -> list[ProbeState]:
        return [s for s in self.states.values() if s.result is None]

    @property
    def finished(self) -> bool:
        return self._finished

    def clear(self) -> None:
        """Show no probes: a step whose probes are still being worked out (a later :meth:`start` shows them)."""
        self._token += 1
        self._finished = False
        self.states = {}
        self._refresh()

    def start(self, host: Host, names: list[str]) -> None:
        """Show ``names`` and run the ones ``host`` has no result for yet."""
        from zdoctor.walk.guide import probe_budget, probe_title

        self._token += 1
        self._finished = False
        self.host = host
        now = self.clock()
        done = host.recorded()
        self.states = {n: ProbeState(n, probe_title(n), probe_budget(n), now, result=done.get(n)) for n in names}
        for st in self.running:
            self.run_worker(partial(self._probe, st.name, self._token), group="probes", exit_on_error=False,
                            name=f"probe {st.name}")
        if self.running:
            if self._timer is None:
                self._timer = self.set_interval(0.2, self._tick)
            else:
                self._timer.resume()
        self._refresh()
        self._check_done()

    async def _probe(self, name: str, token: int) -> None:
        assert self.host is not None
        res = await in_thread(self.host.result, name, name=f"probe:{name}")
        if token == self._token and name in self.states and self.states[name].result is None:
            self.states[name].result = res
            self._refresh()
            self._check_done()

    def cancel(self) -> list[str]:
        """Stop waiting for every probe still running; returns their names."""
        from zdoctor.walk.guide import abandon_probe

        names = []
        now = self.clock()
        for st in self.running:
            assert self.host is not None
            st.result = abandon_probe(self.host, st.name, now - st.started)
            st.cancelled = st.result.status == "timeout" and "cancelled" in (st.result.error or "")
            names.append(st.name)
        self._refresh()
        self._check_done()
        return names

    def _check_done(self) -> None:
        if not self.running and not self._finished:
            self._finished = True
            if self._timer is not None:
                self._timer.pause()
            self._refresh()
            self.post_message(self.Finished(self))

    def _tick(self) -> None:
        self._frame += 1
        if self.running:
            self._refresh(layout=False)  # same lines, new times: no need to lay the screen out again

    def _refresh(self, layout: bool = True) -> None:
        now = self.clock()
        out = Text()
        if self._finished or not self.running:
            out.append("Probes read: ", style="bold")
            for i, st in enumerate(self.states.values()):
                if i:
                    out.append(" · ", style="dim")
                out.append_text(probe_done_text(st))
            self.update(out)
            return
        for i, st in enumerate(self.states.values()):
            if i:
                out.append("\n")
            out.append_text(probe_line(st, now, self._frame))
        self.update(out, layout=layout)

    def summary(self) -> Text:
        """``N probes, the slowest X s`` (recorded durations only: the same on every replay)."""
        results = [s.result for s in self.states.values() if s.result is not None]
        slow = max((r.duration_s for r in results), default=0.0)
        bad = [r.probe for r in results if r.status in ("crash", "timeout")]
        out = Text(f"{len(results)} probe{'s' if len(results) != 1 else ''}, the slowest {slow:.1f} s", style="dim")
        if bad:
            out.append(f"; did not finish: {', '.join(bad)}", style="yellow")
        return out
