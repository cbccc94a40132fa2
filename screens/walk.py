"""The playbook walk: one step at a time, its probes, its evidence, the next step and why."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Header, OptionList, Static
from textual.widgets.option_list import Option

from zdoctor.core.model import Finding, Remedy, sort_findings
from zdoctor.core.plural import count_of
from zdoctor.report.reportdoc import FindingItem, ReportDoc
from zdoctor.walk.ledger import ledger_on
from zdoctor.walk.walkwords import in_words

from .common import SCREENS_CSS, ContextScreen, KeyBar, ProbePanel, in_thread, mark
from .docview import (
    finding_line,
    findings_text,
    folded_symptoms,
    rich_table,
    shown_host,
    step_doc,
    symptoms_text,
    tables_of,
)

INLINE_ROWS = 8
INLINE_TABLES = 2


class BranchList(OptionList):
    """The step's outgoing edges. Where they do not all fit, the highlighted one shows with one edge above
    it for context, placed from the list's final size: where it lands does not depend on how the layout
    got there (the stock list scrolls as little as the size at that moment needs)."""

    def place_highlight(self) -> None:
        if self.highlighted is None or not self.is_mounted:
            return
        height = self.scrollable_content_region.height
        if height <= 0:
            return
        self.scroll_to(y=max(0, min(self.highlighted - 1, self.option_count - height)), animate=False,
                       immediate=True)

    def on_resize(self) -> None:  # Textual calls the stock list's own resize handler as well
        self.place_highlight()


def remedy_pairs(findings: list[Finding],
                 symptoms: Iterable[Mapping[str, Any]] = ()) -> list[tuple[Finding, Remedy]]:
    """Every remedy offered by ``findings``, those of a finding that answers one of ``symptoms`` first, then
    failing findings first, in the order the check gave them."""
    return [(f, r) for f in sort_findings(findings, symptoms) if f.status != "ok" for r in f.remedies]


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


class AskScreen(ModalScreen[str]):
    """A question with a few answers; the first answer is focused and is what Enter and Esc give."""

    CSS_PATH = SCREENS_CSS

    BINDINGS = [Binding("escape", "answer_default", "Cancel", id="ask-cancel")]

    def __init__(self, question: Text, body: Text, answers: list[tuple[str, str, str]]) -> None:
        """``answers``: (id, button label, key) in order; the first is the safe default."""
        super().__init__()
        self.question = question
        self.body = body
        self.answers = answers

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question")
            yield Static(self.body, id="confirm-notes")
            with Horizontal(id="confirm-buttons"):
                for i, (aid, label, key) in enumerate(self.answers):
                    yield Button(f"{label} ({key})", id=f"ask-{aid}", variant="primary" if i == 0 else "default")
            yield Static(Text(" · ".join(f"{key}: {label.lower()}" for _a, label, key in self.answers)
                              + " · Esc or Enter: " + self.answers[0][1].lower(), style="dim"), id="confirm-keys")

    def on_mount(self) -> None:
        self.query_one(f"#ask-{self.answers[0][0]}", Button).focus()

    def on_key(self, event: Any) -> None:
        for aid, _label, key in self.answers:
            if event.key == key:
                event.stop()
                self.dismiss(aid)
                return

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(str(event.button.id).partition("-")[2])

    def action_answer_default(self) -> None:
        self.dismiss(self.answers[0][0])


def failing_findings(walk: Any, current: list[Finding]) -> list[Finding]:
    """Failing findings of the walk so far and of the step on screen (latest per id)."""
    latest = {f.id: f for f in walk.result().findings}
    latest.update({f.id: f for f in current})
    return [f for f in latest.values() if f.status in ("fail", "crash")]


def seen_key(f: FindingItem) -> tuple[str, str, str]:
    """A finding as shown: the same id with another status or title is news."""
    return (f.id, f.status, f.title)


class WalkScreen(ContextScreen):
    """One playbook, one node at a time: why, probes, evidence, the next step and its reason."""

    PALETTE_GROUP = "Walk"
    BINDINGS = [
        Binding("n", "next", "Next step", id="next"),
        Binding("b", "branch", "Other branch", id="branch"),
        Binding("p", "previous", "Previous step", id="previous"),
        Binding("e", "evidence", "Evidence", id="evidence"),
        Binding("r", "remedies", "Fixes", id="remedies"),
        Binding("l", "learn", "Learn more", id="learn"),
        Binding("g", "graph", "Graph", id="graph"),
        Binding("s", "symptoms", "What you saw", id="symptoms"),
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
        #: The symptom ledger as last judged on the host: the findings that answer a symptom come first.
        self.symptoms: list[dict[str, Any]] = []
        #: The report document of the step on screen: its findings with the symptoms they answer.
        self.doc: ReportDoc = step_doc([])
        self.resumed = resumed
        self.show_explain = False
        #: The symptom ledger opened (True) or folded to one line (False) by s; None: open only at a diagnosis.
        self.symptoms_open: bool | None = None
        self._visit = 0
        self.seen_at: dict[tuple[str, str, str], int] = {}  # a finding as shown -> the step that first showed it
        #: Left for the screen it leads back to, while it stays under it (the app's first screen).
        self.left = False

    # -- layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="practice-banner")
        yield Static("", id="crumbs")
        with VerticalScroll(id="walk-body"):
            yield Static("", id="node-title")
            yield Static("", id="node-findings")
            yield Static("", id="node-table")
            yield Static("", id="walk-symptoms")
            yield Static("", id="why")
            yield Static("", id="explain")
            yield ProbePanel(id="node-probes")
        yield Static("", id="verdict")
        yield BranchList(id="branches")
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
        self._visit += 1
        self.outcome = None
        self.findings = []
        self.doc = self.step_doc()
        self.render_header()
        self.query_one("#node-findings", Static).update("")
        self.query_one("#node-table", Static).update("")
        branches = self.query_one("#branches", OptionList)
        branches.clear_options()
        branches.display = False
        if self.walk.done:
            self.findings = self.recorded_findings()
            self.doc = self.step_doc()
            self.query_one(ProbePanel).display = False
            self.show_findings()
            self.show_verdict()
            return
        self.query_one("#verdict", Static).update(Text("Probing… the UI stays live; c stops waiting for slow probes.",
                                                       style="dim"))
        panel = self.query_one(ProbePanel)
        panel.display = True
        panel.clear()
        # which probes the step runs needs every check and predicate registered (the vocabulary, 0.2 s to
        # import the first time): worked out in a thread once the step is drawn
        self.call_after_refresh(self.run_worker, partial(self._start_step, self._visit), group="step",
                                exclusive=True)

    async def _start_step(self, visit: int) -> None:
        """Once the step is drawn: open the session log when it waits (a walk that is the first screen), then
        work out the step's probes and start them."""
        from zdoctor.walk.guide import node_probes

        if self.ctx.opener is not None and await in_thread(self.ctx.open_log, name="session-log"):
            self.notify(self.ctx.note, severity="warning")
        names = await in_thread(node_probes, self.node, name="step-probes")
        if visit == self._visit and not self.walk.done and self.outcome is None and self.is_attached:
            self.query_one(ProbePanel).start(self.ctx.host, names)

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
            self.run_worker(partial(self._evaluate, self._visit), group="evaluate", exclusive=True)

    async def _evaluate(self, visit: int) -> None:
        outcome = await in_thread(self.walk.evaluate, name="evaluate")
        entries = await in_thread(ledger_on, self.ctx.host, name="symptoms")
        if visit == self._visit:
            self.symptoms = [e.to_dict() for e in entries]
            self.show_outcome(outcome)
            self.show_symptoms()

    def step_doc(self) -> ReportDoc:
        """The report document of the step's findings and the symptom ledger, as the exports build it."""
        return step_doc(self.findings, self.symptoms, shown_host(self.ctx))

    def show_symptoms(self) -> None:
        """The symptom ledger above the step, while there is one."""
        doc = self.doc
        box = self.query_one("#walk-symptoms", Static)
        box.update((symptoms_text(doc) if self.ledger_open else folded_symptoms(doc.symptoms)) if doc.symptoms else "")
        box.display = bool(doc.symptoms)

    @property
    def ledger_open(self) -> bool:
        """Whether the ledger shows in full: as s last set it, else only where the walk ends (a diagnosis)."""
        if self.symptoms_open is not None:
            return self.symptoms_open
        return self.walk.done or self.node.kind == "diagnosis"

    def action_symptoms(self) -> None:
        """Open or fold the symptom ledger (one line while folded)."""
        if not self.symptoms:
            from zdoctor.core.present import NO_SYMPTOMS

            self.notify(NO_SYMPTOMS, timeout=5)
            return
        self.symptoms_open = not self.ledger_open
        self.show_symptoms()

    def show_outcome(self, outcome: Any) -> None:
        self.outcome = outcome
        self.findings = list(outcome.findings)
        self.doc = self.step_doc()
        self.show_findings()
        self.show_verdict()
        self.query_one("#branches", OptionList).clear_options()
        self.fill_branches()
        if len(self.walk.path) > 1:  # the ledger was read at the first step: the step's own evidence shows
            self.call_after_refresh(self.query_one("#walk-body").scroll_to_widget, self.query_one("#node-title"),
                                    top=True, animate=False)

    def fill_branches(self) -> None:
        """One line per outgoing edge (cut to the window's width), the suggested one highlighted."""
        outcome = self.outcome
        branches = self.query_one("#branches", BranchList)
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
            self.call_after_refresh(branches.place_highlight)
            if keep is None:
                branches.focus()
        else:
            self.query_one("#walk-body").focus()

    def on_resize(self) -> None:
        if self.outcome is not None:
            self.fill_branches()

    def show_findings(self) -> None:
        """This step's own findings first, with their detail and tables; findings an earlier step already
        showed unchanged follow, one line each, with the step that showed them."""
        findings = self.doc.findings
        step = len(self.walk.path)
        own = [f for f in findings if self.seen_at.get(seen_key(f), step) >= step]
        again = [f for f in findings if f not in own]
        for f in own:
            self.seen_at.setdefault(seen_key(f), step)
        # a step whose own findings all pass shows what they found (the verifying re-run's result)
        calm = not any(f.status in ("fail", "warn", "crash") for f in own)
        text = findings_text(own, detail_lines=4, every_detail=calm) if own else Text()
        if again:
            if own:
                text.append("\n")
            text.append("Shown at an earlier step (e shows it again):\n", style="dim")
            for f in again:
                text.append_text(finding_line(f))
                text.append(f"  (step {self.seen_at[seen_key(f)]})\n", style="dim")
            text.rstrip()
        self.query_one("#node-findings", Static).update(text if findings else
                                                        Text("No findings at this step.", style="dim"))
        tables = [t for t in tables_of(own) if t.highlight][:INLINE_TABLES]
        box = self.query_one("#node-table", Static)
        if not tables:
            box.update("")
            box.display = False
            return
        parts: list[Any] = []
        for table in tables:
            only_hot = len(table.rows) > INLINE_ROWS
            parts.append(rich_table(table, only_hot=only_hot, title=table.label))
            rows = len(table.rows)
            shown = f"the {len(table.highlight)} ⚠ rows of {rows}" if only_hot else f"all {rows} rows"
            parts.append(Text(f"{shown}; e shows every table and output", style="dim"))
        box.update(Group(*parts))
        box.display = True

    def show_verdict(self) -> None:
        node = self.node
        box = self.query_one("#verdict", Static)
        fixes = remedy_pairs(self.findings, self.symptoms)
        if self.walk.done:
            diag = self.walk.playbook.nodes.get(self.walk.diagnosis) if self.walk.diagnosis else None
            # the reason in the words the report document gives it (the engine's record is for the JSON log)
            text = Text.assemble(("Walk finished. ", "bold"), in_words(self.walk.end_reason or ""), "\n")
            if diag is not None:
                text = Text.assemble(self.found_text(), ("Diagnosis: ", "bold"), (diag.title, "bold yellow"), "\n",
                                     ("Walk finished. ", "bold"))
            text.append(("r shows the fixes; " if fixes else "") + "x exports the report; Esc returns.", style="dim")
            box.update(text)
            return
        outcome = self.outcome
        if node.kind == "diagnosis":
            text = Text.assemble(self.found_text(), ("Diagnosis: ", "bold"), (node.title, "bold yellow"), "\n")
            text.append(("r shows the fixes · " if fixes else "") + "x exports the report · n finishes the walk",
                        style="dim")
        elif outcome is not None and outcome.chosen is not None:
            target = self.walk.playbook.nodes[outcome.chosen.to]
            # The edge's own words; the engine's record (``predicate NAME is true``) is for the JSON log.
            why = outcome.chosen.label or in_words(outcome.reason)
            text = Text.assemble(("Next → ", "bold"), (target.title, "bold green"), "\n", ("because ", "dim"), why)
            text.append("\nn or Enter follows it · ↑↓ another branch" + (" · r the fixes" if fixes else ""),
                        style="dim")
        elif outcome is not None:
            text = Text.assemble(("No next step: ", "bold"), in_words(outcome.reason), "\n",
                                 ("n ends the walk here" + (" · r shows the fixes" if fixes else ""), "dim"))
        else:
            text = Text("Probing…", style="dim")
        box.update(text)

    def found_text(self) -> Text:
        """Above a diagnosis: what the walk measured that failed (the findings' own titles, with their values),
        so the ending states what is wrong before the playbook's name for the way out."""
        failing = self.failing_doc().findings
        if not failing:
            return Text()
        out = Text("Found: ", style="bold")
        out.append_text(mark(failing[0].status))
        out.append(f" {failing[0].title}", style="bold")
        if len(failing) > 1:
            out.append(f" (and {len(failing) - 1} more failing: e shows them)", style="dim")
        out.append("\n")
        return out

    def failing_doc(self) -> ReportDoc:
        """The report document of what fails in the walk so far (the step on screen included), worst first."""
        return step_doc(failing_findings(self.walk, self.findings), self.symptoms, shown_host(self.ctx))

    def recorded_findings(self) -> list[Finding]:
        """The findings this session recorded at the current node (for a finished walk, resumed)."""
        from zdoctor.walk.session import load_events

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
            self.after_move()
            return
        target = self.walk.playbook.nodes.get(edge.to)
        failing = self.failing_doc().findings
        if target is not None and target.healthy and failing:
            worst = failing[0]
            question = Text.assemble(("Choose ", "bold"), (target.title, "bold yellow"), (" anyway?", "bold"))
            body = Text(f"It says all is well, but {count_of(len(failing), 'finding')} of this walk fail, "
                        f"first: {worst.title} ({worst.id}).\nThe suggested step is "
                        f"{self.outcome.chosen.to if self.outcome.chosen else 'none'}; the log records your choice.")

            def answered(answer: str | None) -> None:
                if answer == "take":
                    self._take_other(edge)

            self.app.push_screen(AskScreen(question, body, [("keep", "Keep the suggested step", "n"),
                                                            ("take", "Take it anyway", "y")]), answered)
            return
        self._take_other(edge)

    def _take_other(self, edge: Any) -> None:
        self.walk.advance(edge.to)
        self.notify(f"you chose {edge.to} over the suggested step; the log records it", timeout=4)
        self.after_move()

    def action_previous(self) -> None:
        """Go back one step of the path (the probes' results are reused; the log records it)."""
        if len(self.walk.path) < 2:
            self.notify("This is the first step: there is no previous one.", timeout=3)
            return
        self.walk.back()
        self.enter_node()

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
        self.app.push_screen(EvidenceScreen(self.node.title, self.doc))

    def action_remedies(self) -> None:
        from .remedy import RemedyScreen

        pairs = remedy_pairs(self.findings, self.symptoms)
        if not pairs:
            self.notify("No fix is offered at this step." if self.findings else "No findings yet at this step.",
                        timeout=3)
            return
        self.app.push_screen(RemedyScreen(self.ctx, self.walk.playbook.id, self.walk.current, pairs, self.doc))

    def action_graph(self) -> None:
        from zdoctor.walk.guide import graph_text

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
        """Leave the walk; when it is under way and not finished, ask first (the default is to stay)."""
        if self.walk.done or (len(self.walk.path) < 2 and self.outcome is None):
            self.leave()
            return
        question = Text.assemble(("Leave the walk of ", "bold"), (self.walk.playbook.id, "bold yellow"),
                                 (f" at step {len(self.walk.path)}?", "bold"))
        body = Text("It is not finished. What was found so far stays in the session log (x exports it; "
                    "zdoctor --resume picks the walk up), but this screen closes.")
        answers = [("stay", "Stay", "n"), ("leave", "Leave", "y")]
        if len(self.walk.path) > 1:
            answers.insert(1, ("previous", "Previous step", "p"))

        def answered(answer: str | None) -> None:
            if answer == "leave":
                self.leave()
            elif answer == "previous":
                self.action_previous()

        self.app.push_screen(AskScreen(question, body, answers), answered)

    def leave(self) -> None:
        self.query_one(ProbePanel).cancel()  # what this step still runs ends with it (its commands too)
        app: Any = self.app
        if app.can_go_back():
            app.pop_screen()
        elif self is app.screen_stack[0]:  # the app's first screen (--demo SCENARIO): Textual replaces none
            self.left = True  # under the screen it leads to, never gone back to (ZdoctorApp.can_go_back)
            app.push_screen(app.base_screen(self.ctx))
        else:  # opened first over the blank screen (--resume): go to where it would have been opened from
            app.switch_screen(app.base_screen(self.ctx))


