"""The guided session: a start screen and a step-by-step walk through a playbook.

The UI renders engine state and posts intents; every diagnostic decision is the engine's.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from zdoctor.model import Finding, sort_findings
from zdoctor.resources import data_dir

MARKS = {"ok": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "red"), "skip": ("-", "grey50"),
         "crash": ("‼", "magenta")}


def finding_line(f: Finding) -> Text:
    mark, style = MARKS[f.status]
    line = Text.assemble((f" {mark} ", f"bold {style}"), (f.title, ""))
    return line


def render_findings(findings: list[Finding]) -> Text:
    out = Text()
    for f in sort_findings(findings):
        out.append_text(finding_line(f))
        out.append("\n")
        if f.detail and f.status != "ok":
            for line in f.detail.splitlines():
                out.append(f"     {line}\n", style="dim")
        for r in f.remedies if f.status in ("fail", "warn") else []:
            flag = "verified" if r.verified else "unverified"
            out.append(f"     fix: {r.title} ({flag}{', needs root' if r.requires_root else ''})\n", style="bold")
            for cmd in r.commands:
                out.append(f"       {cmd}\n", style="cyan")
    return out


class StartScreen(Screen[None]):
    """The node at a glance, a first pass of every check, and the playbooks."""

    BINDINGS = [Binding("enter", "open", "Walk playbook", show=True), Binding("r", "rerun", "Re-check")]

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static("Probing this node…", id="glance")
            yield Static("", id="first-pass")
            yield Static("[b]Playbooks[/b] — choose one and press Enter", id="pb-title")
            yield OptionList(id="playbooks")
        yield Footer()

    def on_mount(self) -> None:
        from zdoctor.playbook import load_all

        opts = self.query_one("#playbooks", OptionList)
        for pid, book in sorted(load_all().items()):
            opts.add_option(Option(Text.assemble((pid, "bold"), "  ", book.title), id=pid))
        if opts.option_count:
            opts.highlighted = 0
        opts.focus()
        self.first_pass()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def first_pass(self) -> None:
        app: ZdoctorApp = self.app  # type: ignore[assignment]
        findings = app.first_pass()
        self.app.call_from_thread(self.show_first_pass, findings)

    def show_first_pass(self, findings: list[Finding]) -> None:
        app: ZdoctorApp = self.app  # type: ignore[assignment]
        sysfacts = app.host.result("system").facts
        py = app.host.result("pyenv").facts if "pyenv" in app.host.recorded() else {}
        glance = (f"[b]{escape(str(sysfacts.get('hostname', '?')))}[/b]  {escape(str(sysfacts.get('os', '')))}  "
                  f"kernel {escape(str(sysfacts.get('kernel', '')))}  {sysfacts.get('cpus', '?')} CPUs\n"
                  f"target python: {escape(str(py.get('executable') or app.host.info.get('python', '?')))}")
        self.query_one("#glance", Static).update(glance)
        self.query_one("#first-pass", Static).update(render_findings(findings))

    def action_open(self) -> None:
        opts = self.query_one("#playbooks", OptionList)
        if opts.highlighted is None:
            return
        pid = opts.get_option_at_index(opts.highlighted).id
        self.app.push_screen(WalkScreen(str(pid)))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.app.push_screen(WalkScreen(str(event.option.id)))

    def action_rerun(self) -> None:
        self.first_pass()


class WalkScreen(Screen[None]):
    """One playbook, one node at a time: why, probes, evidence, the next step and its reason."""

    BINDINGS = [
        Binding("n", "next", "Next step"),
        Binding("l", "learn", "Learn more"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, playbook_id: str) -> None:
        super().__init__()
        self.playbook_id = playbook_id
        self.walk: Any = None
        self.outcome: Any = None
        self.show_explain = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="crumbs")
        with VerticalScroll():
            yield Static("", id="node-title")
            yield Static("", id="why")
            yield Static("", id="explain")
            yield Static("", id="findings")
            yield DataTable(id="evidence", zebra_stripes=True)
            yield Static("", id="next")
        yield Footer()

    def on_mount(self) -> None:
        from zdoctor.engine import Walk
        from zdoctor.playbook import load_all

        app: ZdoctorApp = self.app  # type: ignore[assignment]
        book = load_all()[self.playbook_id]
        self.walk = Walk(book, app.host, record=app.record)
        self.query_one("#explain", Static).display = False
        self.evaluate()

    def render_node(self) -> None:
        node = self.walk.playbook.nodes[self.walk.current]
        self.query_one("#crumbs", Static).update(Text(" › ".join(self.walk.path), style="dim"))
        self.query_one("#node-title", Static).update(Text(f"{node.title}  [{node.kind}]", style="bold"))
        self.query_one("#why", Static).update(Text(f"Why: {node.why}", style="italic"))
        self.query_one("#explain", Static).update(Text(node.explain))

    @work(thread=True, exclusive=True, exit_on_error=False)
    def evaluate(self) -> None:
        self.app.call_from_thread(self.render_node)
        self.app.call_from_thread(self.query_one("#findings", Static).update, "Probing…")
        outcome = self.walk.evaluate()
        self.app.call_from_thread(self.show_outcome, outcome)

    def show_outcome(self, outcome: Any) -> None:
        self.outcome = outcome
        self.query_one("#findings", Static).update(render_findings(list(outcome.findings)))
        table = self.query_one("#evidence", DataTable)
        table.clear(columns=True)
        tables = [e.table for f in outcome.findings for e in f.evidence if e.table is not None]
        if tables:
            t = tables[0]
            table.add_columns(*t.columns)
            for i, row in enumerate(t.rows):
                style = "bold red" if i in t.highlight else ""
                table.add_row(*[Text(c, style=style) for c in row])
        table.display = bool(tables)
        if outcome.chosen is not None:
            msg = f"Next: {outcome.chosen.to}  ({outcome.reason}) — press n"
        else:
            msg = "End of this playbook: this is the diagnosis. Esc to go back."
        self.query_one("#next", Static).update(Text(msg, style="bold"))

    def action_learn(self) -> None:
        explain = self.query_one("#explain", Static)
        explain.display = not explain.display

    def action_next(self) -> None:
        if self.outcome is None or self.walk.done:
            return
        if self.outcome.chosen is None:
            return
        self.walk.advance()
        if not self.walk.done:
            self.evaluate()

    def action_back(self) -> None:
        self.app.pop_screen()


class ZdoctorApp(App[int]):
    """The zdoctor terminal UI."""

    TITLE = "zdoctor"
    SUB_TITLE = "ZeRO-3 Offload node doctor"
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("e", "export", "Export Markdown")]

    def __init__(self, python: str | None = None, argv: list[str] | None = None, host: Any = None) -> None:
        super().__init__(css_path=str(data_dir("assets") / "zdoctor.tcss"))
        from zdoctor.host import LiveHost

        self.host = host if host is not None else LiveHost(python=python)
        self.argv = argv or []
        self.log_file = None
        self._findings: list[Finding] = []

    def on_mount(self) -> None:
        from zdoctor.errors import ZdoctorError
        from zdoctor.session import SessionLog

        try:
            self.log_file = SessionLog.create("tui", self.argv, self.host.info)
        except (OSError, ZdoctorError) as exc:
            self.notify(f"session not recorded: {exc}", severity="warning")
        self.push_screen(StartScreen())

    def record(self, type_: str, data: dict[str, Any]) -> None:
        if self.log_file is not None:
            self.log_file.record(type_, data)

    def first_pass(self) -> list[Finding]:
        from zdoctor.doctor import check

        report = check(self.host, record=self.record, walk=False)
        self._findings = report.findings
        return report.findings

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A probe or walk that broke is shown, never swallowed."""
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name} failed: {event.worker.error}", severity="error", timeout=10)

    def action_export(self) -> None:
        from zdoctor.export import render, write_export
        from zdoctor.session import load_events

        if self.log_file is None:
            self.notify("nothing recorded to export", severity="warning")
            return
        out = f"zdoctor-{self.log_file.id}.md"
        write_export(render(load_events(self.log_file.id), "md"), out)
        self.notify(f"exported to {out}")

    def on_unmount(self) -> None:
        if self.log_file is not None:
            self.log_file.close(0)


def make_app(python: str | None = None, argv: list[str] | None = None, host: Any = None) -> ZdoctorApp:
    """The one factory the CLI and the tests use (``host``: a replayed snapshot instead of this node)."""
    return ZdoctorApp(python=python, argv=argv, host=host)
