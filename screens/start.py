"""The start screen: the node at a glance, a first pass of every check, playbooks, practice, resume."""

from __future__ import annotations

from collections.abc import Collection
from functools import partial
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Header, Input, OptionList, Static
from textual.widgets.option_list import Option

from zdoctor.core.model import Finding
from zdoctor.core.present import ALSO_FOUND
from zdoctor.proc.target import DEFAULT_PYTHON

from .common import START_CSS, ContextScreen, KeyBar, ProbePanel, in_thread

if TYPE_CHECKING:
    from zdoctor.report.reportdoc import ReportDoc

GPU_PROBE = "nvml"


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) and n > 0 else "?"


def gpu_line(host: Any, probes: Collection[str] | None = None) -> Text:
    """The GPUs the ``nvml`` probe found (it may be skipped: no driver, or no GPU visible). ``probes``: the
    probes of the first pass, ``None`` before they are known (the registry is loaded after the first paint)."""
    res = host.recorded().get(GPU_PROBE)
    if res is None:
        if probes is None:
            return Text("GPUs: not probed yet", style="dim")
        return Text("GPUs: probing…" if GPU_PROBE in probes else "GPUs: not probed by this zdoctor", style="dim")
    if res.status != "ok":
        why = str(res.error or res.status).split(":")[0]
        return Text(f"GPUs: none usable ({why[:70]})", style="dim")
    gpus = [g for g in res.facts.get("gpus") or [] if isinstance(g, dict)]
    if not gpus:
        return Text("GPUs: none found", style="dim")
    names: dict[str, int] = {}
    for g in gpus:
        total = (g.get("memory") or {}).get("total") if isinstance(g.get("memory"), dict) else None
        label = str(g.get("name") or "GPU") + (f" ({_gib(total)})" if total else "")
        names[label] = names.get(label, 0) + 1
    out = Text("GPUs: " + ", ".join(f"{n} × {label}" for label, n in names.items()))
    if res.facts.get("driver"):
        out.append(f" · driver {res.facts['driver']}", style="dim")
    return out


def phrases(parts: list[tuple[str, Text]], width: int | None) -> Text:
    """Each ``(separator, phrase)`` after the one before it; with ``width``, lines break between phrases (the
    separator is dropped there), never inside one."""
    out = Text()
    used = 0
    for i, (sep, part) in enumerate(parts):
        if i and width and used + len(sep) + part.cell_len > width:
            out.append("\n")
            used, sep = 0, ""
        out.append(sep if i else "")
        out.append_text(part)
        used += (len(sep) if i else 0) + part.cell_len
    return out


def glance_text(host: Any, width: int | None = None, probes: Collection[str] | None = ()) -> Text:
    """Host, OS, CPUs and memory; GPUs; the target interpreter with torch and DeepSpeed. With ``width``, a
    line breaks between its phrases (" · "), never in the middle of one. ``probes``: those the first pass
    runs (``None``: not known yet); a probe not among them is "not probed"."""
    info = host.info
    rec = host.recorded()
    sysf = rec["system"].facts if "system" in rec and rec["system"].status == "ok" else {}
    name = sysf.get("hostname") or info.get("hostname") or "?"
    parts = [str(sysf.get("os") or info.get("os") or ""), f"kernel {sysf.get('kernel') or info.get('kernel') or '?'}",
             str(sysf.get("arch") or info.get("arch") or "")]
    if sysf.get("cpus"):
        parts.append(f"{sysf['cpus']} CPUs")
    mem = (sysf.get("memory") or {}).get("MemTotal")
    if mem:
        parts.append(f"{_gib(mem)} RAM")
    out = phrases([("", Text(name, style="bold")), *((" · " if i else "  ", Text(p))
                                                     for i, p in enumerate(q for q in parts if q))], width)
    out.append("\n")
    out.append_text(gpu_line(host, probes))
    out.append("\n")
    py = rec["pyenv"].facts if "pyenv" in rec and rec["pyenv"].status == "ok" else None
    target = info.get("python") or DEFAULT_PYTHON
    if py is None:
        state = "not probed yet" if probes is None else "probing…" if "pyenv" in probes and "pyenv" not in rec \
            else "not probed"
        out.append(f"Target: {target} ({state})", style="dim")
    else:
        from zdoctor.walk.guide import target_label

        pyinfo = py.get("python") or {}
        label = target_label(py, target)  # the path the findings name, and the one --python takes
        version = str(pyinfo.get("version") or "?").split()[0]
        env = "conda" if (pyinfo.get("conda") or {}).get("prefix_is_conda") else "venv" if pyinfo.get("in_venv") else ""
        torch = py.get("torch") or {}
        ds = py.get("deepspeed") or {}
        out.append_text(phrases([
            ("", Text.assemble("Target: ", (label, "bold"))),
            ("  ", Text(f"Python {version}{f' ({env})' if env else ''}")),
            (" · ", Text(f"torch {torch.get('version') or torch.get('dist_version')}" if torch.get("installed")
                         else "no torch")),
            (" · ", Text(f"DeepSpeed {ds.get('version')}" if ds.get("installed") else "no DeepSpeed"))], width))
        if torch.get("installed") is False:
            out.append(f"\n! torch is not installed in {label}: nothing of torch, DeepSpeed or their ops can be "
                       "checked there", style="bold yellow")
    if info.get("kind") == "replay":
        import os

        out.append(f"\nReplayed from the snapshot {os.path.basename(str(info.get('source') or '?'))}", style="dim")
    return out


def menu_entries() -> tuple[dict[str, Any], list[Any]]:
    """The start menu's playbooks and practice scenarios (none when the scenarios' catalogue is broken: it
    must not hide the rest of the menu); the session log's modules are loaded too, for what follows."""
    import zdoctor.walk.session  # noqa: F401 - loaded here, off the event loop, before the log is opened
    from zdoctor.walk.playbook import load_all
    from zdoctor.walk.practice import load_scenarios

    try:
        scenarios = load_scenarios()
    except Exception:  # noqa: BLE001 - a broken catalogue must not hide the rest of the menu
        scenarios = []
    return load_all(), scenarios


def purpose(summary: str, limit: int = 100) -> str:
    """The first sentence of a playbook's summary, cut at a word near ``limit`` characters."""
    first = " ".join((summary or "").split()).split(". ")[0].rstrip(".") + "."
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0] + " …"


class StartScreen(ContextScreen):
    """The node at a glance, a first pass of every check, and what to do next."""

    PALETTE_GROUP = "Start"
    CSS_PATH = START_CSS
    BINDINGS = [
        Binding("o", "open", "Open", id="open"),
        Binding("r", "recheck", "Re-check", id="recheck"),
        Binding("c", "cancel", "Cancel probes", id="cancel"),
        Binding("p", "practice", "Practice", id="practice"),
        Binding("u", "resume_last", "Resume", id="resume"),
        Binding("s", "symptom", "Paste error", id="symptom"),
    ]

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.findings: list[Finding] | None = None
        self.sessions: list[Any] | None = None
        self.symptoms: list[dict[str, Any]] = []
        self.pass_probes: list[str] | None = None  # known once the registry is loaded, after the first paint
        self.menu_data: tuple[dict[str, Any], list[Any]] | None = None  # read after the first paint

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="start-top"):
            # the first pass's failures before the node's description, the other findings after it: at 80x24
            # a failing finding shows without scrolling
            yield Static(Text("First pass of every check", style="bold underline"), id="pass-title")
            yield ProbePanel(id="pass-probes")
            yield Static("", id="pass-findings")
            yield Static(glance_text(self.ctx.host, None, self.pass_probes), id="glance")
            yield Static("", id="pass-rest")
        yield Static(Text("Next: wait for the first pass of every check (c cancels a slow probe)", style="bold"),
                     id="next-step")
        # the symptom box and the menu follow the first frame (:meth:`controls`): the menu is empty until
        # its playbooks are read anyway, and the two are the costliest widgets to style and draw
        yield KeyBar()

    def closed(self) -> bool:
        """Whether the screen's widgets are gone (the app quit while a worker of it waited on a thread): what
        the thread answered has nowhere to be shown."""
        return not self.is_attached or not self.query(ProbePanel)

    def controls(self) -> None:
        """Mount the symptom box and the menu above the key bar, once (after the first frame, or at once
        for a key pressed before it), and focus the menu."""
        if self.query("#start-menu"):
            return
        self.mount(Input(placeholder="s: paste the error you saw (optional), then Enter", id="symptom-box"),
                   OptionList(id="start-menu"), before=self.query_one(KeyBar))
        self.query_one("#start-menu", OptionList).focus()

    def glance_width(self) -> int | None:
        """The glance's line width (its own content width, inside padding), once laid out."""
        try:
            width = self.query_one("#glance", Static).content_size.width
        except Exception:  # noqa: BLE001 - not composed yet
            return None
        return width - 2 if width > 10 else None  # less room for a scroll bar that may appear

    def show_glance(self) -> None:
        self.query_one("#glance", Static).update(glance_text(self.ctx.host, self.glance_width(), self.pass_probes))

    def on_resize(self) -> None:
        self.show_glance()

    def on_mount(self) -> None:
        # the screen is drawn first; the menu (playbooks, scenarios), the sessions and the probes follow
        self.call_after_refresh(self.after_first_paint)

    def after_first_paint(self) -> None:
        self.controls()
        self.run_worker(self._start_up, group="start-up", exclusive=True)

    async def _start_up(self) -> None:
        """The session log, the menu, the sessions and the first pass; what they read from disk is read in
        a thread, so the first frame is written out meanwhile."""
        data = await in_thread(menu_entries)
        if self.closed():
            return
        self.ready(data)
        self.run_worker(self._load_sessions, group="sessions", exclusive=True)
        self.action_recheck()

    def ready(self, data: tuple[dict[str, Any], list[Any]] | None = None) -> None:
        """Open the session log and fill the menu, once: from the start-up's thread, or at once for a key
        pressed before it answered."""
        if self.menu_data is not None:
            return
        self.menu_data = data if data is not None else menu_entries()
        app: Any = self.app
        app.open_later_log(self.ctx)
        self.fill_menu()

    # -- the menu ----------------------------------------------------------------------------------
    def fill_menu(self) -> None:
        self.controls()
        books, scenarios = self.menu_data if self.menu_data is not None else menu_entries()
        menu = self.query_one("#start-menu", OptionList)
        keep = menu.highlighted_option.id if menu.highlighted_option is not None else None
        menu.clear_options()
        menu.add_option(Option(Text("Playbooks: walk one step by step (Enter or o)", style="bold"), disabled=True))
        for pid, book in sorted(books.items(), key=lambda kv: (kv[0] != "zero3-launch", kv[0])):
            menu.add_option(Option(Text.assemble("  ", (pid, "bold cyan"), "  ", book.title, "\n    ",
                                                 (purpose(book.summary), "dim")), id=f"pb:{pid}"))
        if scenarios:
            menu.add_option(Option(Text("Practice (learn mode): replay a recorded broken node", style="bold"),
                                   disabled=True))
            for s in scenarios:
                part = f"part {s.part}: " if s.part is not None else ""
                menu.add_option(Option(Text.assemble("  ", (s.id, "bold cyan"), f"  {part}{s.title}"),
                                       id=f"demo:{s.id}"))
        if self.sessions:
            menu.add_option(Option(Text("Resume a recorded session", style="bold"), disabled=True))
            for point in self.sessions:
                menu.add_option(Option(Text.assemble("  ", (point.session_id, "bold cyan"), "  ",
                                                     point.describe()), id=f"resume:{point.session_id}"))
        ids = [menu.get_option_at_index(i).id for i in range(menu.option_count)]
        menu.highlighted = ids.index(keep) if keep is not None and keep in ids else next(
            (i for i, oid in enumerate(ids) if oid is not None), None)

    async def _load_sessions(self) -> None:
        from zdoctor.walk.resume import resumable_sessions

        own = {c.log.id for c in getattr(self.app, "contexts", []) if c.log is not None}
        found = await in_thread(resumable_sessions)
        if self.closed():
            return
        self.sessions = [p for p in found if p.session_id not in own]
        if self.sessions:
            self.fill_menu()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.open(event.option.id)

    def action_open(self) -> None:
        self.ready()
        menu = self.query_one("#start-menu", OptionList)
        if menu.highlighted_option is not None:
            self.open(menu.highlighted_option.id)

    def open(self, oid: str | None) -> None:
        if not oid:
            return
        kind, _, value = oid.partition(":")
        app: Any = self.app
        if kind == "pb":
            app.start_walk(self.ctx, value)
        elif kind == "demo":
            from zdoctor.walk.practice import get_scenario

            app.start_practice(get_scenario(value))
        elif kind == "resume":
            app.resume_session(value)

    def action_practice(self) -> None:
        self.app.action_practice()  # type: ignore[attr-defined]

    def action_resume_last(self) -> None:
        if not self.sessions:
            self.notify("no recorded session to resume", severity="warning")
            return
        self.app.resume_session(self.sessions[0].session_id)  # type: ignore[attr-defined]

    # -- the first pass ----------------------------------------------------------------------------
    def action_recheck(self) -> None:
        """Run every probe the checks need (again, after a first pass) and evaluate every check."""
        panel = self.query_one(ProbePanel)
        if panel.running:
            return
        fresh = self.findings is not None
        self.findings = None
        panel.display = True
        self.query_one("#pass-findings", Static).update(Text("Probing this node… (c cancels)", style="dim"))
        self.run_worker(partial(self._start_pass, fresh), group="first-pass", exclusive=True)

    async def _start_pass(self, fresh: bool) -> None:
        from zdoctor.walk.guide import first_pass_probes

        names = await in_thread(first_pass_probes)
        if self.closed():
            return
        self.pass_probes = names
        if fresh:
            self.ctx.host.forget(names)
        self.query_one(ProbePanel).start(self.ctx.host, names)
        self.show_glance()

    def action_symptom(self) -> None:
        self.controls()
        self.query_one("#symptom-box", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """A pasted error becomes a symptom of the session: the checks are judged against it again."""
        event.stop()
        text = event.value.strip()
        box = self.query_one("#symptom-box", Input)
        box.value = ""
        self.query_one("#start-menu", OptionList).focus()
        if not text:
            return
        target = getattr(self.ctx.host, "target", None)
        if target is None:
            self.notify("a recorded node's symptoms are as recorded", severity="warning")
            return
        target.options.setdefault("symptom", []).append(text)
        self.ctx.host.forget(["symptoms"])
        self.notify("judging the checks against the error you pasted", timeout=3)
        self.run_worker(self._evaluate, group="first-pass-check", exclusive=True)

    def action_cancel(self) -> None:
        names = self.query_one(ProbePanel).cancel()
        if names:
            self.notify(f"stopped waiting for {', '.join(names)}", timeout=4)

    def on_probe_panel_finished(self, event: ProbePanel.Finished) -> None:
        self.show_glance()
        self.run_worker(self._evaluate, group="first-pass-check", exclusive=True)

    async def _evaluate(self) -> None:
        from zdoctor.walk.doctor import check

        from .docview import check_doc

        report = await in_thread(check, self.ctx.host, self.ctx.record, None, False)
        if self.closed():
            return
        self.symptoms = report.symptoms
        self.findings = report.findings
        self.show_findings(check_doc(report))

    def show_findings(self, doc: ReportDoc) -> None:
        """The first pass as its report document says it: what the user saw and the findings that answer it
        first (with none, the box below asks for it), the failing rest, the count, then what passed."""
        from .docview import findings_text, summary_text, symptoms_text

        panel = self.query_one(ProbePanel)
        others = doc.rest
        failing = [f for f in others if f.status in ("fail", "crash")]
        out = Text()
        if doc.symptoms:
            out.append_text(symptoms_text(doc))
            out.append("\n")
        out.append_text(Text.assemble(summary_text(doc.counts), "   ", panel.summary()))
        if doc.answers:
            out.append("\n")
            out.append_text(findings_text(doc.answers))
        if doc.symptoms and failing:
            out.append(f"\n{ALSO_FOUND}:", style="bold")
        if failing:
            out.append("\n")
            out.append_text(findings_text(failing))
        self.query_one("#pass-findings", Static).update(out)
        rest = findings_text([f for f in others if f not in failing])
        self.query_one("#pass-rest", Static).update(rest)
        panel.display = False
        self.show_glance()
        self.query_one("#next-step", Static).update(Text(self.next_line(self.findings or []), style="bold"))

    def next_line(self, findings: list[Finding]) -> str:
        """The one "what to do next" line (see :func:`zdoctor.walk.guide.next_step`)."""
        from zdoctor.walk.guide import next_step
        from zdoctor.walk.playbook import load_all

        res = self.ctx.host.recorded().get("pyenv")
        pyenv = res.facts if res is not None and res.status == "ok" else None
        return next_step(findings, pyenv, replay=self.ctx.host.info.get("kind") == "replay", host=self.ctx.host,
                         books=load_all(), symptoms=self.symptoms)
