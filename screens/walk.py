"""The playbook walk: one step at a time, its probes, its evidence, the next step and why."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Header, OptionList, Static
from textual.widgets.option_list import Option

from zdoctor.model import Finding, Remedy, sort_findings

from .common import ContextScreen, KeyBar, ProbePanel, findings_text, in_thread, rich_table, tables_of

INLINE_ROWS = 8
INLINE_TABLES = 2


def remedy_pairs(findings: list[Finding]) -> list[tuple[Finding, Remedy]]:
    """Every remedy offered by ``findings``, failing findings first, in the order the check gave them."""
    return [(f, r) for f in sort_findings(list(findings)) if f.status != "ok" for r in f.remedies]


def candidate_text(c: Any, chosen: Any, book: Any, shadowed: bool = False) -> Text:
    """One outgoing edge on one line: where it leads, when, and what its predicate said (``shadowed``:
    it holds, but an edge listed before it holds too and is the one taken)."""
    target = book.nodes.get(c.edge.to)
    is_chosen = chosen is not None and c.edge is chosen
    out = Text("→ " if is_chosen else "  ", style="bold", no_wrap=True, overflow="ellipsis")
    out.append(c.edge.to, style="bold cyan" if is_chosen else "cyan")
    out.append(f": {c.edge.label or (target.title if target is not None else '')}")
    if c.edge.is_fallback:
        verdict = "fallback"
    elif c.error is not None:
        verdict = f"{c.edge.condition_text} failed: {c.error}"
    else:
        verdict = f"{c.edge.condition_text}: {'yes' if c.holds else 'no'}"
        if shadowed:
            verdict += ", but an earlier branch applies first"
    out.append(f"  [{verdict}{'; suggested' if is_chosen else ''}]", style="bold green" if is_chosen else "dim")
    return out


class WalkScreen(ContextScreen):
    """One playbook, one node at a time: why, probes, evidence, the next step and its reason."""

    PALETTE_GROUP = "Walk"
    BINDINGS = [
        Binding("n", "next", "Next step", id="next"),
        Binding("b", "branch", "Other branch", id="branch"),
        Binding("e", "evidence", "Evidence", id="evidence"),
        Binding("r", "remedies", "Fixes", id="remedies"),
        Binding("l", "learn", "Learn more", id="learn"),
        Binding("g", "graph", "Graph", id="graph"),
        Binding("c", "cancel", "Cancel probes", id="cancel"),
        Binding("escape", "back", "Back", id="back"),
        Binding("pagedown", "scroll_body(1)", "Scroll down", show=False, priority=True),
        Binding("pageup", "scroll_body(-1)", "Scroll up", show=False, priority=True),
    ]

    def __init__(self, ctx: Any, walk: Any, resumed: bool = False) -> None:
        super().__init__(ctx)
        self.walk = walk
        self.outcome: Any = None
        self.findings: list[Finding] = []
        self.resumed = resumed
        self.show_explain = False
        self._visit = 0

    # -- layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="practice-banner")
        yield Static("", id="crumbs")
        with VerticalScroll(id="walk-body"):
            yield Static("", id="node-title")
            yield Static("", id="why")
            yield Static("", id="explain")
            yield ProbePanel(id="node-probes")
            yield Static("", id="node-findings")
            yield Static("", id="node-table")
        yield Static("", id="verdict")
        yield OptionList(id="branches")
        yield KeyBar()

    def on_mount(self) -> None:
        banner = self.query_one("#practice-banner", Static)
        if self.ctx.practice:
            banner.update(Text.assemble(("Practice", "bold reverse"), f" recorded on "
                                        f"{self.ctx.host.info.get('hostname', '?')}; nothing runs here · "
                                        "l: story · t: terms", style=""))
        banner.display = self.ctx.practice
        self.enter_node()

    @property
    def node(self) -> Any:
        return self.walk.node

    # -- one step ----------------------------------------------------------------------------------
    def enter_node(self) -> None:
        """Show the current node and run its probes (each in its own thread)."""
        from zdoctor.guide import node_probes

        self._visit += 1
        self.outcome = None
        self.findings = []
        self.render_header()
        self.query_one("#node-findings", Static).update("")
        self.query_one("#node-table", Static).update("")
        branches = self.query_one("#branches", OptionList)
        branches.clear_options()
        branches.display = False
        if self.walk.done:
            self.findings = self.recorded_findings()
            self.query_one(ProbePanel).display = False
            self.show_findings(self.findings)
            self.show_verdict()
            return
        self.query_one("#verdict", Static).update(Text("Probing… the UI stays live; c stops waiting for slow probes.",
                                                       style="dim"))
        panel = self.query_one(ProbePanel)
        panel.display = True
        panel.start(self.ctx.host, node_probes(self.node))

    def render_header(self) -> None:
        node = self.node
        crumbs = Text()
        for i, nid in enumerate(self.walk.path):
            if i:
                crumbs.append(" › ", style="dim")
            last = i == len(self.walk.path) - 1
            crumbs.append(f"{i + 1} {nid}", style="bold reverse" if last else "dim")
        self.query_one("#crumbs", Static).update(crumbs)
        title = Text.assemble((node.title, "bold"), (f"  [{node.kind}]", "dim"))
        self.query_one("#node-title", Static).update(title)
        self.query_one("#why", Static).update(Text.assemble(("Why this step: ", "bold"), (node.why, "italic")))
        explain = Text(node.explain.strip())
        if self.ctx.practice and node.id == self.walk.playbook.start:
            explain = Text.assemble(("The story\n", "bold"), self.ctx.scenario.story, "\n\n", explain)
        explain.append("\n\nt opens the glossary (RPATH, RUNPATH, GLIBCXX, SONAME ...).", style="dim")
        box = self.query_one("#explain", Static)
        box.update(explain)
        box.display = self.show_explain

    def on_probe_panel_finished(self, event: ProbePanel.Finished) -> None:
        event.stop()
        if not self.walk.done and self.outcome is None:
            self.run_worker(self._evaluate(self._visit), group="evaluate", exclusive=True)

    async def _evaluate(self, visit: int) -> None:
        outcome = await in_thread(self.walk.evaluate, name="evaluate")
        if visit == self._visit:
            self.show_outcome(outcome)

    def show_outcome(self, outcome: Any) -> None:
        self.outcome = outcome
        self.findings = list(outcome.findings)
        self.show_findings(self.findings)
        self.show_verdict()
        self.query_one("#branches", OptionList).clear_options()
        self.fill_branches()

    def fill_branches(self) -> None:
        """One line per outgoing edge (cut to the window's width), the suggested one highlighted."""
        outcome = self.outcome
        branches = self.query_one("#branches", OptionList)
        keep = branches.highlighted if branches.option_count else None
        branches.clear_options()
        if outcome is None or self.walk.done:
            branches.display = False
            return
        width = max(20, self.app.size.width - 4)
        chosen_index = None
        for i, c in enumerate(outcome.candidates):
            shadowed = chosen_index is not None and bool(c.holds)
            line = candidate_text(c, outcome.chosen, self.walk.playbook, shadowed)
            line.truncate(width, overflow="ellipsis")
            branches.add_option(Option(line, id=f"edge:{i}"))
            if outcome.chosen is not None and c.edge is outcome.chosen:
                chosen_index = i
        branches.display = bool(outcome.candidates)
        if outcome.candidates:
            branches.highlighted = keep if keep is not None else (chosen_index if chosen_index is not None else 0)
            if keep is None:
                branches.focus()
        else:
            self.query_one("#walk-body").focus()

    def on_resize(self) -> None:
        if self.outcome is not None:
            self.fill_branches()

    def show_findings(self, findings: list[Finding]) -> None:
        self.query_one("#node-findings", Static).update(findings_text(findings, detail_lines=4) if findings else
                                                        Text("No findings at this step.", style="dim"))
        tables = [fe for fe in tables_of(findings) if fe[1].table is not None and fe[1].table.highlight][:INLINE_TABLES]
        box = self.query_one("#node-table", Static)
        if not tables:
            box.update("")
            box.display = False
            return
        parts: list[Any] = []
        for _f, ev in tables:
            table = ev.table
            only_hot = len(table.rows) > INLINE_ROWS
            parts.append(rich_table(table, only_hot=only_hot, title=ev.label))
            rows = len(table.rows)
            shown = f"the {len(table.highlight)} ⚠ rows of {rows}" if only_hot else f"all {rows} rows"
            parts.append(Text(f"{shown}; e shows every table and output", style="dim"))
        box.update(Group(*parts))
        box.display = True

    def show_verdict(self) -> None:
        node = self.node
        box = self.query_one("#verdict", Static)
        fixes = remedy_pairs(self.findings)
        if self.walk.done:
            diag = self.walk.playbook.nodes.get(self.walk.diagnosis) if self.walk.diagnosis else None
            text = Text.assemble(("Walk finished. ", "bold"), self.walk.end_reason or "")
            if diag is not None:
                text = Text.assemble(("Diagnosis: ", "bold"), (diag.title, "bold yellow"), "\n",
                                     ("Walk finished. ", "bold"))
            text.append(("r shows the fixes; " if fixes else "") + "x exports the report; Esc returns.", style="dim")
            box.update(text)
            return
        outcome = self.outcome
        if node.kind == "diagnosis":
            text = Text.assemble(("Diagnosis: ", "bold"), (node.title, "bold yellow"), "\n")
            text.append(("r shows the fixes · " if fixes else "") + "x exports the report · n finishes the walk",
                        style="dim")
        elif outcome is not None and outcome.chosen is not None:
            target = self.walk.playbook.nodes[outcome.chosen.to]
            why = outcome.chosen.label or outcome.reason
            if not outcome.chosen.is_fallback:
                why += f" ({outcome.reason})"
            text = Text.assemble(("Next → ", "bold"), (target.title, "bold green"), "\n", ("because ", "dim"), why)
            text.append("\nn or Enter follows it · ↑↓ another branch" + (" · r the fixes" if fixes else ""),
                        style="dim")
        elif outcome is not None:
            text = Text.assemble(("No next step: ", "bold"), outcome.reason, "\n",
                                 ("n ends the walk here" + (" · r shows the fixes" if fixes else ""), "dim"))
        else:
            text = Text("Probing…", style="dim")
        box.update(text)

    def recorded_findings(self) -> list[Finding]:
        """The findings this session recorded at the current node (for a finished walk, resumed)."""
        from zdoctor.session import load_events

        if self.ctx.log is None:
            return []
        latest: dict[str, Finding] = {}
        try:
            events = load_events(self.ctx.log.path)
        except Exception:  # noqa: BLE001 - a log that cannot be read shows no findings, not a crash
            return []
        for ev in events:
            if (ev.get("type") == "finding" and ev.get("playbook") == self.walk.playbook.id
                    and ev.get("node") == self.walk.current and isinstance(ev.get("finding"), dict)):
                try:
                    f = Finding.from_dict(ev["finding"])
                except (KeyError, TypeError, ValueError):
                    continue
                latest[f.id] = f
        return list(latest.values())

    # -- moving ------------------------------------------------------------------------------------
    def action_next(self) -> None:
        if self.walk.done:
            self.notify("The walk is finished: x exports the report, Esc returns to the start.", timeout=4)
            return
        if self.outcome is None:
            self.notify("Still probing: c stops waiting for the probes still running.", timeout=4)
            return
        self.walk.advance()
        self.after_move()

    def take(self, index: int) -> None:
        if self.outcome is None or self.walk.done or not 0 <= index < len(self.outcome.candidates):
            return
        edge = self.outcome.candidates[index].edge
        if self.outcome.chosen is not None and edge is self.outcome.chosen:
            self.walk.advance()
        else:
            self.walk.advance(edge.to)
            self.notify(f"you chose {edge.to} over the suggested step; the log records it", timeout=4)
        self.after_move()

    def after_move(self) -> None:
        if self.walk.done:
            self.render_header()
            self.show_verdict()
            self.query_one("#branches", OptionList).display = False
            return
        self.enter_node()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id and event.option.id.startswith("edge:"):
            self.take(int(event.option.id.partition(":")[2]))

    def action_branch(self) -> None:
        branches = self.query_one("#branches", OptionList)
        if self.outcome is None or not branches.option_count:
            self.notify("No branches to choose from yet.", timeout=3)
            return
        branches.focus()
        self.notify("↑↓ to pick a branch, Enter to take it", timeout=3)

    # -- other views -------------------------------------------------------------------------------
    def action_evidence(self) -> None:
        from .evidence import EvidenceScreen

        if not self.findings:
            self.notify("No evidence yet at this step.", timeout=3)
            return
        self.app.push_screen(EvidenceScreen(self.node.title, self.findings))

    def action_remedies(self) -> None:
        from .remedy import RemedyScreen

        pairs = remedy_pairs(self.findings)
        if not pairs:
            self.notify("No fix is offered at this step." if self.findings else "No findings yet at this step.",
                        timeout=3)
            return
        self.app.push_screen(RemedyScreen(self.ctx, self.walk.playbook.id, self.walk.current, pairs))

    def action_graph(self) -> None:
        from zdoctor.guide import graph_text

        from .info import TextScreen

        text = graph_text(self.walk.playbook, self.walk.path, None if self.walk.done else self.walk.current)
        self.app.push_screen(TextScreen(f"Playbook graph: {self.walk.playbook.id} (←→ scrolls sideways)", Text(text),
                                        anchor="●" if not self.walk.done else None))

    def action_learn(self) -> None:
        self.show_explain = not self.show_explain
        box = self.query_one("#explain", Static)
        box.display = self.show_explain
        if self.show_explain:
            self.query_one("#walk-body", VerticalScroll).scroll_to_widget(box, animate=False)

    def action_cancel(self) -> None:
        names = self.query_one(ProbePanel).cancel()
        if names:
            self.notify(f"stopped waiting for {', '.join(names)}", timeout=4)

    def action_scroll_body(self, direction: int) -> None:
        body = self.query_one("#walk-body", VerticalScroll)
        (body.scroll_page_down if direction > 0 else body.scroll_page_up)(animate=False)

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()
        else:  # opened first (--demo SCENARIO, --resume): go to where it would have been opened from
            self.app.switch_screen(self.app.base_screen(self.ctx))  # type: ignore[attr-defined]


