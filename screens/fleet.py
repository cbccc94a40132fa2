"""The fleet: every node's checks as a matrix, the facts that should match across nodes, and each node's
findings and each fact's values, one selection away."""

from __future__ import annotations

import contextlib
import shlex
import time
import typing
from pathlib import Path
from typing import TYPE_CHECKING

from rich.columns import Columns
from rich.console import RenderableType
from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static
from textual.worker import Worker, WorkerState

from zdoctor.core.errors import ZdoctorError
from zdoctor.core.model import Finding
from zdoctor.core.plural import count_of
from zdoctor.core.present import MARKS, STYLES, pasted_script
from zdoctor.fleet.result import NODE_PROBLEMS, families

from .base import HELP, QUIT, AppBase
from .common import SCREENS_CSS, KeyBar
from .docview import flags_text, step_doc
from .evidence import EvidenceScreen
from .info import ExportScreen
from .remedy import shell

if TYPE_CHECKING:
    from zdoctor.fleet.collect import NodeRun
    from zdoctor.fleet.live import LiveFleet
    from zdoctor.fleet.result import FleetReport, NodeResult
    from zdoctor.fleet.skew import SkewRow

#: Writes the fleet report in a format (md, html, json); returns the path written.
Exporter = typing.Callable[[str], Path]
LAUNCH_WIDTH = 48
VALUE_WIDTH = 44
#: The exit code when the user stops a collection before every node has answered (as for Ctrl+C).
CANCELLED = 130


def smark(status: str) -> Text:
    """A status as its mark, coloured (the mark alone carries the meaning without colour)."""
    return Text(MARKS.get(status, "?"), style=f"bold {STYLES.get(status, '')}".strip())


def shorten(text: str, width: int) -> str:
    """``text`` on one line, cut in the middle to ``width`` characters (paths keep their ends)."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    head = (width - 1) // 2
    return flat[:head] + "…" + flat[len(flat) - (width - 1 - head):]


def run_text(run: NodeRun, width: int = LAUNCH_WIDTH) -> Text:
    """How the launcher fared, in a few words: dim ``ok``, or the problem and its error, shortened."""
    if run.status == "ok":
        return Text("ok", style="dim")
    what = run.status + (f": {run.error}" if run.error else "")
    return Text(shorten(what, width), style="bold red")


def launch_text(node: NodeResult, width: int = LAUNCH_WIDTH) -> Text:
    """:func:`run_text` of a node of the report."""
    return run_text(node.run, width)


def header_text(report: FleetReport) -> Text:
    s = report.summary
    out = Text.assemble(("Fleet", "bold"), f"  {report.launcher} · {report.source}  ")
    if not report.nodes:
        out.append("no nodes", style="bold yellow")
        return out
    out.append(f"{s['reached']} of {s['nodes']} nodes reached", style="" if s["reached"] == s["nodes"] else "yellow")
    out.append(" · ")
    out.append_text(smark("fail" if s["failing"] else "ok"))
    out.append(f" {s['failing']} failing")
    if s["warning"]:
        out.append(" · ")
        out.append_text(smark("warn"))
        out.append(f" {s['warning']} warning")
    n = s["differing_facts"]
    if not s["reached"]:
        out.append(" · no facts to compare", style="dim")
    else:
        out.append(" · ")
        out.append_text(smark("fail" if n else "ok"))
        out.append(f" {count_of(n, 'fact')} {'differs' if n == 1 else 'differ'}")
    problems = [f"{s[k]} {k}" for k in NODE_PROBLEMS if s.get(k)]
    if problems:
        out.append(f" ({', '.join(problems)})", style="yellow")
    return out


def skew_mark(row: SkewRow) -> Text:
    return smark("fail" if row.differs else "ok") if row.values and row.fact.judged else smark("skip")


# --- the fleet ---------------------------------------------------------------------------------------

class FleetScreen(Screen[None]):
    """The node x check-family matrix and the skew table; Enter opens a node or a fact."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "Fleet"
    BINDINGS = [
        Binding("n", "focus_table('fleet-matrix')", "Nodes", id="nodes"),
        Binding("f", "focus_table('fleet-skew')", "Facts", id="facts"),
        Binding("x", "export", "Export", id="export"),
    ]

    def __init__(self, report: FleetReport, exporter: Exporter | None = None) -> None:
        super().__init__()
        self.report = report
        self.exporter = exporter
        self.families = families(report.checks)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(header_text(self.report), id="fleet-head")
        yield Static(Text.assemble(("Nodes", "bold"), ("  Enter opens a node's findings · Tab moves to the "
                                                      "facts", "dim")), classes="fleet-label")
        yield DataTable(id="fleet-matrix", cursor_type="row", zebra_stripes=False)
        yield Static(Text.assemble(("Facts every node should share", "bold"),
                                   ("  Enter shows a fact on every node", "dim")), classes="fleet-label")
        yield DataTable(id="fleet-skew", cursor_type="row", zebra_stripes=False)
        yield KeyBar()

    def on_mount(self) -> None:
        self.fill_matrix()
        self.fill_skew()
        self.query_one("#fleet-matrix", DataTable).focus()

    def fill_matrix(self) -> None:
        grid = self.query_one("#fleet-matrix", DataTable)
        grid.add_column("", key="mark")
        grid.add_column("node", key="node")
        grid.add_column("launch", key="launch")  # before the families: how each node was reached stays in view
        for fam in self.families:
            grid.add_column(fam, key=f"fam:{fam}")
        for node in self.report.nodes:
            cells = []
            for checks in self.families.values():
                status = node.family_status(checks)
                cells.append(smark(status) if status is not None else Text(""))
            grid.add_row(smark(node.status), Text(node.host, style="bold" if node.status != "ok" else ""),
                         launch_text(node), *cells, key=node.host)

    def skew_rows(self) -> list[SkewRow]:
        """Facts that differ first, then the rest, each in the report's order."""
        return sorted(self.report.skew, key=lambda r: not r.differs)

    def fill_skew(self) -> None:
        grid = self.query_one("#fleet-skew", DataTable)
        grid.add_column("", key="mark")
        grid.add_column("fact", key="fact")
        grid.add_column("differs on", key="differing")
        grid.add_column("most nodes", key="majority")
        for row in self.skew_rows():
            hot = "bold red" if row.differs else ""
            if not row.fact.judged and row.values:  # each node's own value (an address): shown, not compared
                value = Text(shorten("; ".join(f"{h}: {v}" for h, v in row.values.items()), VALUE_WIDTH), style="dim")
            elif row.majority is None:
                value = Text("no node reached", style="dim")
            else:
                value = Text(shorten(row.majority, VALUE_WIDTH))
                if row.tie:
                    value.append(" (tie)", style="yellow")
            grid.add_row(skew_mark(row), Text(row.fact.title, style=hot),
                         Text(", ".join(row.differing), style=hot), value, key=row.fact.id)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        key = event.row_key.value
        if key is None:
            return
        if event.data_table.id == "fleet-matrix":
            self.app.push_screen(FleetNodeScreen(self.report.node(key), self.report.checks))
        elif event.data_table.id == "fleet-skew":
            row = next(r for r in self.report.skew if r.fact.id == key)
            self.app.push_screen(FleetFactScreen(row, [n.host for n in self.report.nodes], self.report))

    def action_focus_table(self, table_id: str) -> None:
        self.query_one(f"#{table_id}", DataTable).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "export":
            return self.exporter is not None
        return True

    def action_export(self) -> None:
        if self.exporter is not None:
            self.app.push_screen(ExportScreen(self.exporter, "the fleet report",
                                             f"Session {self.report.session}; written to {Path.cwd()}"
                                             if self.report.session else "Written to the current directory"))


# --- one node ---------------------------------------------------------------------------------------

def launch_detail(node: NodeResult) -> Text:
    """For a node that gave no snapshot: the launcher's problem, its command, exit code and stderr."""
    run = node.run
    if node.reached:
        out = Text.assemble(smark("ok"), " reached", (f" in {run.duration_s:.1f} s", "dim"))
        if run.argv:
            out.append(f"  $ {shlex.join(run.argv)}", style="dim")
        return out
    out = Text.assemble(smark("fail"), " ", (NODE_PROBLEMS.get(run.status, run.status), "bold red"))
    if run.error:
        out.append(f": {run.error}", style="red")
    if run.argv:
        out.append("\n$ " + shlex.join(run.argv), style="bold")
    out.append(f"\nexit code {run.exit_code} after {run.duration_s:.1f} s", style="dim")
    if run.stderr:
        out.append("\nstderr:", style="dim")
        for line in run.stderr:
            out.append(f"\n  {line}")
    return out


def cells_text(node: NodeResult, checks: list[str]) -> RenderableType:
    """Every check's cell on ``node``, one row per family: ``gpu  ✓ driver  ✗ runtime ...``."""
    groups = families([c for c in checks if c in node.cells])
    if not groups:
        return Text("no checks ran on this node", style="dim")
    grid = RichTable.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for fam, names in groups.items():
        items = [Text.assemble(smark(node.cells[n]), " ", (n.partition(".")[2] or n,
                                                           "bold" if node.cells[n] != "ok" else "")) for n in names]
        grid.add_row(fam, Columns(items, padding=(0, 2)))
    return grid


class FleetNodeScreen(Screen[None]):
    """One node: how the launcher fared, its findings worst first, and every check's cell."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "Fleet node"
    BINDINGS = [
        Binding("escape", "back", "Back", id="back"),
        Binding("c", "focus_cells", "Checks", id="cells"),
    ]

    def __init__(self, node: NodeResult, checks: list[str]) -> None:
        super().__init__()
        self.node = node
        self.checks = checks
        #: The node's findings as its report document orders and words them (worst first).
        self.doc = step_doc(node.findings, (), {"hostname": node.host})

    def compose(self) -> ComposeResult:
        node = self.node
        yield Header()
        yield Static(Text.assemble(smark(node.status), " ", (node.host, "bold"), f"  {node.status}",
                                   ("  Enter opens a finding · Esc goes back", "dim")), classes="screen-title")
        yield Static(launch_detail(node), id="fleet-node-launch")
        yield DataTable(id="fleet-node-findings", cursor_type="row", zebra_stripes=False)
        with VerticalScroll(id="fleet-node-cells-box"):
            yield Static(cells_text(node, self.checks), id="fleet-node-cells")
        yield KeyBar()

    def on_mount(self) -> None:
        grid = self.query_one("#fleet-node-findings", DataTable)
        grid.add_column("", key="mark")
        grid.add_column("finding", key="id")
        grid.add_column("title", key="title")
        for f in self.doc.findings:
            bold = "bold" if f.status in ("fail", "crash") else ""
            grid.add_row(smark(f.status), Text(f.id, style=bold), Text(f.title, style=bold), key=f.id)
        grid.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        found = next((f for f in self.node.findings if f.id == event.row_key.value), None)
        if found is not None:
            self.app.push_screen(FleetFindingScreen(self.node.host, found))

    def action_focus_cells(self) -> None:
        self.query_one("#fleet-node-cells-box", VerticalScroll).focus()

    def action_back(self) -> None:
        self.app.pop_screen()


class FleetFindingScreen(EvidenceScreen):
    """One finding of one node: its detail and evidence (as on the evidence screen), then its remedies."""

    PALETTE_GROUP = "Fleet finding"

    def __init__(self, host: str, finding: Finding) -> None:
        super().__init__(f"{host} · {finding.id}", step_doc([finding], (), {"hostname": host}))
        self.node_host = host
        (self.finding,) = self.doc.findings

    def on_mount(self) -> None:
        super().on_mount()
        body = self.query_one("#ev-body", VerticalScroll)
        if not self.finding.remedies:
            return
        parts: list[Static] = [Static(Text(f"Remedies (run them on {self.node_host})", style="bold"),
                                      classes="ev-finding")]
        for r in self.finding.remedies:
            head = Text(r.title, style="bold")
            if r.explanation:
                head.append(f"\n{r.explanation}", style="dim")
            parts.append(Static(head, classes="ev-label"))
            parts.append(Static(flags_text(r), classes="ev-item"))
            if r.commands:
                parts.append(Static(shell(pasted_script(r.commands)), classes="ev-item"))
            if r.undo:
                parts.append(Static(Text("undo:", style="dim"), classes="ev-item"))
                parts.append(Static(shell(pasted_script(r.undo)), classes="ev-ref"))
        body.mount_all(parts)


# --- one fact ---------------------------------------------------------------------------------------

class FleetFactScreen(Screen[None]):
    """One fact on every node, side by side: the nodes that differ from the majority are marked ✗."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "Fleet fact"
    BINDINGS = [Binding("escape", "back", "Back", id="back")]

    def __init__(self, row: SkewRow, hosts: list[str], report: FleetReport | None = None) -> None:
        super().__init__()
        self.row = row
        self.hosts = hosts
        self.report = report

    def summary(self) -> Text:
        row = self.row
        out = Text.assemble(skew_mark(row), " ", (row.fact.title, "bold"))
        if not row.values:
            out.append(": no node was reached", style="dim")
        elif row.tie:
            out.append(" is split between nodes (no majority)", style="bold red")
        elif row.differs:
            out.append(f" differs on {', '.join(row.differing)}", style="bold red")
        else:
            out.append(" is the same on every node reached", style="green")
        if row.values:
            out.append("\nMost nodes: ", style="bold")
            out.append(row.majority or "")
            groups: dict[str, list[str]] = {}
            for host, value in row.values.items():
                groups.setdefault(value, []).append(host)
            if len(groups) > 1:
                for value, hosts in groups.items():
                    hot = "bold red" if value != row.majority else ""
                    out.append(f"\n  {shorten(value, VALUE_WIDTH)}: ", style=hot)
                    out.append(", ".join(hosts))
        out.append("\nWhy it matters: ", style="bold")
        out.append(row.fact.why)
        return out

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text.assemble(("Fact", "bold"), f"  {self.row.fact.id}", ("  Esc goes back", "dim")),
                     classes="screen-title")
        yield Static(self.summary(), id="fleet-fact-summary")
        yield DataTable(id="fleet-fact-values", cursor_type="row", zebra_stripes=False)
        yield KeyBar()

    def on_mount(self) -> None:
        row = self.row
        grid = self.query_one("#fleet-fact-values", DataTable)
        grid.add_column("", key="mark")
        grid.add_column("node", key="node")
        grid.add_column(row.fact.title, key="value")
        for host in self.hosts:
            if host in row.values:
                hot = host in row.differing
                style = "bold red" if hot else ""
                grid.add_row(smark("fail" if hot else "ok"), Text(host, style=style),
                             Text(row.values[host], style=style), key=host)
            else:
                why = "not reached"
                if self.report is not None:
                    why += f": {self.report.node(host).run.status}"
                grid.add_row(smark("skip"), Text(host, style="dim"), Text(f"({why})", style="dim"), key=host)
        grid.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        host = event.row_key.value
        if self.report is not None and host is not None:
            self.app.push_screen(FleetNodeScreen(self.report.node(host), self.report.checks))

    def action_back(self) -> None:
        self.app.pop_screen()


# --- collecting -------------------------------------------------------------------------------------

def collect_head(live: LiveFleet, answered: int, elapsed: float, failed: bool = False) -> Text:
    """``Fleet  ssh · hostfile  2 of 3 nodes answered · 4 s``."""
    total = len(live.hosts)
    out = Text.assemble(("Fleet", "bold"), f"  {live.launcher} · {live.source}  ")
    if failed:
        out.append("collection failed", style="bold red")
        return out
    out.append(f"{answered} of {count_of(total, 'node')} answered",
               style="" if answered == total else "yellow")
    out.append(f" · {elapsed:.0f} s", style="dim")
    return out


class FleetCollectScreen(Screen[None]):
    """Every node as it answers, while the fleet is collected in a thread; the matrix replaces it once
    every node has answered or timed out."""

    CSS_PATH = SCREENS_CSS

    PALETTE_GROUP = "Fleet collection"
    BINDINGS = [Binding("ctrl+c", "app.quit", "Stop and quit", show=False, priority=True)]

    def __init__(self, live: LiveFleet) -> None:
        super().__init__()
        self.live = live
        self.started = time.monotonic()
        self.arrived: dict[str, NodeRun] = {}
        self.failure: ZdoctorError | None = None
        self.finished = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(collect_head(self.live, 0, 0.0), id="fleet-collect-head")
        yield Static(Text.assemble(("Nodes", "bold"), ("  each as it answers · q stops and quits", "dim")),
                     classes="fleet-label")
        yield DataTable(id="fleet-collect-nodes", cursor_type="row", zebra_stripes=False)
        yield Static("", id="fleet-collect-error")
        yield KeyBar()

    def on_mount(self) -> None:
        grid = self.query_one("#fleet-collect-nodes", DataTable)
        grid.add_column("", key="mark")
        grid.add_column("node", key="node")
        grid.add_column("launch", key="launch")
        grid.add_column("time", key="time")
        for host in self.live.hosts:
            grid.add_row(Text("·", style="dim"), Text(host), Text("waiting…", style="dim"),
                         Text("0 s", style="dim"), key=host)
        grid.focus()
        self.ticker = self.set_interval(1.0, self.tick)
        app = self.app

        def arrived(node: NodeRun) -> None:  # on the collecting thread
            if self.live.cancelled:
                return
            with contextlib.suppress(RuntimeError):  # the app has gone
                app.call_from_thread(self.show_node, node)

        def work() -> FleetReport | ZdoctorError:
            try:
                return self.live.run(arrived)
            except ZdoctorError as exc:
                return exc

        self.run_worker(work, name="fleet collection", group="fleet-collect", thread=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def show_head(self) -> None:
        self.query_one("#fleet-collect-head", Static).update(
            collect_head(self.live, len(self.arrived), self.elapsed(), self.failure is not None))

    def tick(self) -> None:
        self.show_head()
        grid = self.query_one("#fleet-collect-nodes", DataTable)
        waited = Text(f"{self.elapsed():.0f} s", style="dim")
        for host in self.live.hosts:
            if host not in self.arrived:
                grid.update_cell(host, "time", waited, update_width=True)

    def show_node(self, node: NodeRun) -> None:
        """One node answered (or gave up): its mark, how the launcher fared and how long it took."""
        if self.live.cancelled or not self.is_mounted or node.host not in self.live.hosts:
            return
        self.arrived[node.host] = node
        grid = self.query_one("#fleet-collect-nodes", DataTable)
        grid.update_cell(node.host, "mark", smark("ok" if node.status == "ok" else "fail"))
        grid.update_cell(node.host, "node", Text(node.host, style="" if node.status == "ok" else "bold"))
        grid.update_cell(node.host, "launch", run_text(node), update_width=True)
        grid.update_cell(node.host, "time", Text(f"{node.duration_s:.1f} s"), update_width=True)
        self.show_head()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "fleet-collect" or event.state != WorkerState.SUCCESS:
            return
        self.finished = True
        self.ticker.stop()
        result = event.worker.result
        if isinstance(result, ZdoctorError):
            self.failure = result
            self.show_head()
            self.query_one("#fleet-collect-error", Static).update(Text(str(result), style="bold red"))
            if isinstance(self.app, FleetApp):
                self.app.failure = result
        elif result is not None and not self.live.cancelled and isinstance(self.app, FleetApp):
            self.app.show_report(result, self)

    def on_unmount(self) -> None:
        if not self.finished and not self.live.cancelled:  # going away mid-collection: leave no launcher running
            self.live.cancel()


# --- the app ----------------------------------------------------------------------------------------

class FleetApp(AppBase):
    """The fleet report on its own, or first the collection of it from a live fleet; quitting exits with
    the report's exit code (130 while the nodes are still being collected, 2 when collecting failed)."""

    TITLE = "zdoctor fleet"
    BINDINGS = [HELP, QUIT]

    def __init__(self, report: FleetReport | None = None, exporter: Exporter | None = None, *,
                 live: LiveFleet | None = None) -> None:
        if (report is None) == (live is None):
            raise TypeError("FleetApp: give either a fleet report or a live fleet")
        super().__init__()
        self.report = report
        self.live = live
        self.exporter = exporter
        self.failure: ZdoctorError | None = None
        if report is not None:
            self.sub_title = self.nodes_over(len(report.nodes), report.launcher)
        elif live is not None:
            self.sub_title = self.nodes_over(len(live.hosts), live.launcher)

    @staticmethod
    def nodes_over(n: int, launcher: str) -> str:
        return f"{count_of(n, 'node')} over {launcher}"

    def on_mount(self) -> None:
        if self.report is not None:
            self.push_screen(FleetScreen(self.report, self.exporter))
        elif self.live is not None:
            self.push_screen(FleetCollectScreen(self.live))

    def show_report(self, report: FleetReport, collecting: Screen[None]) -> None:
        """Replace the collection screen (and anything opened over it) with the fleet screen."""
        self.report = report
        self.sub_title = self.nodes_over(len(report.nodes), report.launcher)
        while self.screen is not collecting and len(self.screen_stack) > 2:
            self.pop_screen()
        self.switch_screen(FleetScreen(report, self.exporter))

    async def action_quit(self) -> None:
        if self.report is not None:
            self.exit(self.report.exit_code)
        elif self.failure is not None:
            self.exit(self.failure.exit_code)
        else:  # still collecting: kill the launchers, and do not wait for the report
            if self.live is not None:
                self.live.cancel()
            self.exit(CANCELLED)


def make_fleet_app(report: FleetReport | None = None, exporter: Exporter | None = None, *,
                   live: LiveFleet | None = None) -> FleetApp:
    """The fleet screen as an app (``exporter``: writes the report as md/html/json, returns the path); with
    ``live`` instead of a report, the nodes are collected on a collection screen first."""
    return FleetApp(report, exporter, live=live)
