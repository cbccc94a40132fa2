"""Remedies: the exact commands, whether they were verified, need root, can be undone; copy, apply
(only after a confirmation whose default is No), live output, and the outcome in the session log."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from functools import partial
from typing import Any

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Header, Log, OptionList, Static
from textual.widgets.option_list import Option

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.present import (
    first_line,
    fix_groups,
    only_changes_the_shell,
    option_label,
    pasted_script,
    recommendation,
    script_label,
    undo_label,
    written_text,
)
from zdoctor.proc import children
from zdoctor.proc.target import target_of
from zdoctor.report.reportdoc import FindingItem, RemedyItem, ReportDoc, remedy_items
from zdoctor.walk.apply import ApplyOutcome, ApplyPlan, core_action, env_effect, known_env, plan, run_remedy
from zdoctor.walk.events import record_remedy

from .common import SCREENS_CSS, ContextScreen, KeyBar, in_thread, mark
from .docview import finding_item, flags_text, remedy_item, shown_host, step_doc, trial_mark, trial_text


def shell(lines: list[str]) -> Syntax:
    return Syntax("\n".join(lines), "bash", word_wrap=True, theme="ansi_dark", background_color="default")


def effect_table(r: Remedy, env: dict[str, str]) -> RichTable | None:
    """Each variable the remedy's export/unset lines change: now, and after the fix."""
    rows = env_effect(r.commands, env)
    if not rows:
        return None
    grid = RichTable(title="The environment now and after the fix", title_justify="left", expand=False)
    grid.add_column("variable", no_wrap=True)
    grid.add_column("now", overflow="fold")
    grid.add_column("after the fix", overflow="fold")
    for name, now, after in rows:
        grid.add_row(name, now if now is not None else Text("(unset)", style="dim"),
                     Text(after if after is not None else "(unset)", style="bold"))
    return grid


def training_env(host: Any) -> dict[str, str]:
    """The environment remedies run in: the training's for a live node, else this process's."""
    return dict(target_of(host).env)


#: The one thing applying a remedy of export/unset lines alone does.
SHELL_ONLY_NOTE = ("These lines only change a shell, and zdoctor cannot change the one you launch training from: "
                   "it writes them to a file for you to source in that shell. Nothing runs here, and nothing else "
                   "on this machine changes.")


def shell_only(r: Remedy, how: ApplyPlan) -> bool:
    """Whether applying ``r`` only writes its export/unset lines to a file to source (nothing runs)."""
    return bool(how.env_lines) and not r.action and only_changes_the_shell(r.commands)


class ConfirmApply(ModalScreen[bool]):
    """Apply this remedy? The focused answer, and the one Enter gives, is No."""

    CSS_PATH = SCREENS_CSS

    BINDINGS = [
        Binding("y", "answer(True)", "Yes, apply", id="yes"),
        Binding("n,escape", "answer(False)", "No", id="no"),
    ]

    def __init__(self, remedy: Remedy, how: ApplyPlan, notes: list[str]) -> None:
        super().__init__()
        self.remedy = remedy
        self.how = how
        self.notes = notes

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            verb = "Write to a file to source: " if shell_only(self.remedy, self.how) else "Apply "
            yield Static(Text.assemble((verb, "bold"), (self.remedy.title, "bold yellow"), ("?", "bold")),
                         id="confirm-question")
            yield Static(shell(self.remedy.commands), id="confirm-commands")
            yield Static(Text("\n".join(f"• {n}" for n in self.notes)), id="confirm-notes")
            with Horizontal(id="confirm-buttons"):
                yield Button("No", id="no", variant="primary")
                yield Button("Yes, write it" if shell_only(self.remedy, self.how) else "Yes, apply", id="yes",
                             variant="error")
            yield Static(Text("y: yes · n or Esc: no · Enter presses the focused button (No)", style="dim"),
                         id="confirm-keys")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class RemedyScreen(ContextScreen):
    """The remedies of one step, grouped by finding (each finding's own alternatives or steps, a fix that
    depends on another after it); each can be copied, declined or applied."""

    PALETTE_GROUP = "Fixes"
    BINDINGS = [
        Binding("a", "apply", "Apply", id="apply"),
        Binding("d", "decline", "Decline", id="decline"),
        Binding("y", "copy", "Copy commands", id="copy"),
        Binding("u", "undo", "Undo", id="undo"),
        Binding("c", "cancel", "Cancel run", id="cancel"),
        Binding("escape", "back", "Back", id="back"),
        Binding("pagedown", "scroll_body(1)", "Scroll down", show=False, priority=True),
        Binding("pageup", "scroll_body(-1)", "Scroll up", show=False, priority=True),
    ]

    def __init__(self, ctx: Any, playbook: str, node: str, pairs: list[tuple[Finding, Remedy]],
                 doc: ReportDoc | None = None) -> None:
        """``doc``: the report document of the step the pairs' findings are from (made from them when not given)."""
        super().__init__(ctx)
        self.playbook = playbook
        self.node = node
        # Grouped by finding: one finding's remedies are alternatives (or steps) among themselves only; a
        # finding whose fix depends on another's comes after it.
        self.groups = fix_groups(pairs)
        self.pairs = [(g.finding, r) for g in self.groups for r in g.remedies]
        self.group_of = [g for g in self.groups for _r in g.remedies]
        self.labels = [option_label(j, len(g.remedies), g.steps, r) for g in self.groups
                       for j, r in enumerate(g.remedies, 1)]
        if doc is None or any(finding_item(doc, f.id) is None for f, _r in pairs):
            doc = step_doc(dict((f.id, f) for f, _r in pairs).values(), (), shown_host(ctx))
        self.doc = doc
        self.option_at: dict[int, int] = {}
        self.running: threading.Event | None = None
        self.outcomes: dict[int, str] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        head = Text.assemble(("Fixes", "bold"), f" at {self.node}")
        if len(self.groups) == 1:
            (group,) = self.groups
            head.append(f" for: {self.finding_of(group.finding).title}")
            head.append(f"\n{group.heading}", style="bold")
            if recommendation(group.remedies):
                head.append(f" {recommendation(group.remedies)}", style="dim")
        else:
            head.append(f": {len(self.groups)} findings, each with its own fix, in the order to do them",
                        style="bold")
        yield Static(head, id="rem-title")
        yield OptionList(id="remedies")
        with VerticalScroll(id="rem-body"):
            yield Static("", id="rem-result")
            yield Log(id="rem-log", highlight=False, max_lines=5000)
            yield Static("", id="rem-commands")
            yield Static("", id="rem-flags")
            yield Static("", id="rem-effect")
            yield Static("", id="rem-undo")
            yield Static("", id="rem-explain")
        yield KeyBar()

    def group_text(self, k: int) -> Text:
        """The line above one finding's remedies: the finding, how its remedies relate, what comes first."""
        g = self.groups[k]
        item = self.finding_of(g.finding)
        out = Text.assemble(mark(item.status), " ", (item.title, "bold"), f" — {g.heading}")
        if g.also_for:
            out.append("\n   also the fix for: " + "; ".join(self.finding_of(f).title for f in g.also_for), style="dim")
        if g.after:
            titles = {f.id: f.title for f in self.doc.findings}
            out.append(f"\n   {first_line(g.after, titles)}", style="bold yellow")
        return out

    def finding_of(self, f: Finding) -> FindingItem:
        """The document's item of one of the screen's findings."""
        item = finding_item(self.doc, f.id)
        assert item is not None  # the document is made from these findings
        return item

    def item(self, f: Finding, r: Remedy) -> RemedyItem:
        """The document's item of a remedy of ``f`` (an undo made here: one made as the document makes them)."""
        found = remedy_item(self.doc, f, f.remedies.index(r)) if r in f.remedies else None
        return found or remedy_items([r], self.elsewhere, {x.id: x.title for x in self.doc.findings})[0]

    def on_mount(self) -> None:
        menu = self.query_one("#remedies", OptionList)
        i = 0
        for k, g in enumerate(self.groups):
            if len(self.groups) > 1:
                menu.add_option(Option(self.group_text(k), id=f"head:{k}", disabled=True))
            for r in g.remedies:
                self.option_at[i] = menu.option_count
                menu.add_option(Option(self.option_text(i, g.finding, r), id=f"rem:{i}"))
                i += 1
        menu.highlighted = self.option_at.get(0, 0)
        menu.focus()
        self.query_one("#rem-log", Log).display = False
        self.query_one("#rem-result", Static).display = False
        self.show(0)

    def option_text(self, i: int, f: Finding, r: Remedy) -> Text:
        item = self.item(f, r)
        flag, style = trial_mark(item)
        out = Text.assemble(f"{self.labels[i]}: ", (flag, style), " ", (item.title, "bold"))
        if item.requires_root:
            out.append("  [root]", style="yellow")
        done = self.outcomes.get(i)
        if done:
            out.append(f"  [{done}]", style="bold")
        return out

    @property
    def index(self) -> int:
        """The remedy highlighted in the list (a finding's heading line is not one)."""
        menu = self.query_one("#remedies", OptionList)
        at = menu.highlighted or 0
        option_id = (menu.get_option_at_index(at).id or "") if menu.option_count else ""
        if option_id.startswith("rem:"):
            return int(option_id.partition(":")[2])
        return next((i for i, o in self.option_at.items() if o > at), 0)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id and event.option.id.startswith("rem:"):
            self.show(int(event.option.id.partition(":")[2]))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.query_one("#rem-body", VerticalScroll).focus()

    def show(self, i: int) -> None:
        f, r = self.pairs[i]
        item = self.item(f, r)
        self.query_one("#rem-flags", Static).update(flags_text(item))
        self.query_one("#rem-explain", Static).update(Text(item.explanation) if item.explanation else "")
        parts: list[Any] = []
        if item.first:
            parts.append(Text(item.first, style="bold yellow"))
        parts += [Text(f"{self.labels[i]}: {script_label(item.commands)}:", style="bold"),
                  shell(pasted_script(item.commands))]
        self.query_one("#rem-commands", Static).update(Group(*parts))
        table = effect_table(r, known_env(self.ctx.host))
        effect = self.query_one("#rem-effect", Static)
        effect.update(table if table is not None else "")
        effect.display = table is not None
        undo = self.query_one("#rem-undo", Static)
        undo.update(Group(Text(f"{undo_label(item.undo)}:", style="bold"), shell(pasted_script(item.undo)))
                    if item.undo else "")
        undo.display = bool(item.undo)

    @property
    def elsewhere(self) -> bool:
        """The evidence came from another node (practice or a replayed snapshot)."""
        return bool(self.ctx.practice) or self.ctx.host.info.get("kind") == "replay"

    # -- actions -----------------------------------------------------------------------------------
    def action_copy(self) -> None:
        f, r = self.pairs[self.index]
        self.app.copy_to_clipboard("\n".join(pasted_script(r.commands)) + "\n")
        record_remedy(self.ctx.record, "copied", self.playbook, self.node, f.id, r)
        self.notify(f"copied {count_of(len(r.commands), 'line')} to the clipboard (OSC 52: where the terminal "
                    "allows it; "
                    "otherwise select them on screen)", timeout=5)

    def action_decline(self) -> None:
        f, r = self.pairs[self.index]
        self.decline(f, r, "declined")

    def decline(self, f: Finding, r: Remedy, how: str) -> None:
        record_remedy(self.ctx.record, "declined", self.playbook, self.node, f.id, r, how=how)
        self.mark_done(self.index, "declined")
        self.result(Text(f"Declined ({how}): nothing was run. The session log records it.", style="bold"))

    def action_apply(self) -> None:
        if self.running is not None:
            self.notify("A remedy is running: c cancels it.", severity="warning")
            return
        i = self.index
        f, r = self.pairs[i]
        if not r.recommended:
            self.notify(f"Not applied: not recommended, because {r.note or 'the node does not support it'}. "
                        "Copy its commands (y) only if you know better than these facts.", severity="warning")
            return
        how = plan(r)
        self.app.push_screen(ConfirmApply(r, how, self.notes(self.item(f, r), r, how)),
                             callback=partial(self.confirmed, i, f, r, how))

    def notes(self, item: RemedyItem, r: Remedy, how: ApplyPlan) -> list[str]:
        """What applying ``r`` does here (``item``: its entry in the document, for its trial state and what it
        needs first)."""
        here = socket.gethostname()
        info = self.ctx.host.info
        out = [item.first] if item.first else []
        if self.ctx.practice:
            # Nothing runs and nothing is written: no "runs in the terminal", no file to source.
            out.append("Practice: nothing is run; you see what would run on the recorded node.")
            out.append(str(trial_text(item)))
            out.append("Undo: " + (" && ".join(r.undo) if r.undo else "none recorded."))
            return out
        if shell_only(r, how):
            # One thing happens: a file is written. Nothing runs, so no "runs here" and no terminal.
            out.append(SHELL_ONLY_NOTE)
            out.append(str(trial_text(item)))
            return out
        core = core_action(r)
        out.append(f"Runs here, on {here}: {core}." if core else
                   f"Runs here, on {here}, in bash; it stops at the first line that fails.")
        if info.get("kind") == "replay":
            out.append(f"The evidence came from a snapshot of {info.get('hostname', 'another node')}: the "
                       "commands act on THIS machine.")
        out += [f"Runs in the terminal: {reason}." for reason in how.reasons]
        if how.env_lines:
            out.append("export/unset lines cannot change the shell you launch from: they are also written to a "
                       "file for you to source.")
        out.append(str(trial_text(item)))
        out += [f"{said}: the commands will fail here." for said in item.missing]
        out.append("Undo: " + (" && ".join(r.undo) if r.undo else "none recorded."))
        return out

    def confirmed(self, i: int, f: Finding, r: Remedy, how: ApplyPlan, yes: bool | None) -> None:
        if not yes:
            self.decline(f, r, "answered No in the confirmation")
            return
        if self.ctx.practice:
            self.practise(i, f, r)
        elif how.interactive:
            self.run_in_terminal(i, f, r, how)
        else:
            self.run_worker(partial(self.stream, i, f, r), group="apply", exclusive=True)

    def action_undo(self) -> None:
        """Undo the highlighted fix this screen applied: its recorded undo lines, after the same confirmation."""
        if self.running is not None:
            self.notify("A remedy is running: c cancels it.", severity="warning")
            return
        i = self.index
        f, r = self.pairs[i]
        if self.outcomes.get(i) != "applied":
            self.notify("Nothing to undo: this fix was not applied here.", timeout=4)
            return
        if not r.undo:
            self.notify("This fix recorded no undo.", severity="warning", timeout=4)
            return
        undo = Remedy(title=f"Undo: {r.title}", commands=list(r.undo), verified=None,
                      requires_root=r.requires_root)
        how = plan(undo)
        self.app.push_screen(ConfirmApply(undo, how, self.notes(self.item(f, undo), undo, how)),
                             callback=partial(self.undo_confirmed, i, f, undo, how))

    def undo_confirmed(self, i: int, f: Finding, undo: Remedy, how: ApplyPlan, yes: bool | None) -> None:
        if not yes:
            self.notify("Not undone: nothing was run.", timeout=4)
            return
        if how.interactive:
            self.run_in_terminal(i, f, undo, how, undoing=True)
        else:
            self.run_worker(partial(self.stream, i, f, undo, undoing=True), group="apply", exclusive=True)

    def practise(self, i: int, f: Finding, r: Remedy) -> None:
        log = self.query_one("#rem-log", Log)
        log.display = True
        log.clear()
        log.write_line("Practice: on the recorded node this would run:")
        for c in pasted_script(r.commands):
            for line in c.splitlines():
                log.write_line(f"  {line}")
        record_remedy(self.ctx.record, "practised", self.playbook, self.node, f.id, r)
        self.mark_done(i, "practised")
        self.result(Text("Practice: nothing was run on this machine.", style="bold"))

    def env_file(self) -> tuple[Any, str]:
        from zdoctor.walk.session import state_dir

        sid = self.ctx.log.id if self.ctx.log is not None else "unrecorded"
        return state_dir() / "fixes", f"fix-{sid}-{int(time.time() * 1000) % 10**9}.sh"

    async def stream(self, i: int, f: Finding, r: Remedy, note: str = "", undoing: bool = False) -> None:
        log = self.query_one("#rem-log", Log)
        log.display = True
        log.clear()
        if note:
            log.write_line(note)
        core = core_action(r)
        if shell_only(r, plan(r)):
            log.write_line(f"writing {count_of(len(r.commands), 'line')} to a file to source; nothing runs")
        else:
            log.write_line(f"$ {core}" if core else
                           f"$ bash -c (set -e -x; {count_of(len(r.commands), 'line')}), in the training environment")
        loop = asyncio.get_running_loop()

        def on_output(line: str) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(log.write_line, line)

        self.running = threading.Event()
        self.result(Text("Running… c cancels.", style="bold"))
        try:
            outcome = await in_thread(partial(run_remedy, r, training_env(self.ctx.host), on_output=on_output,
                                              cancel=self.running, env_file=self.env_file()), name="apply")
        finally:
            self.running = None
        self.finish(i, f, r, outcome, undoing)

    def run_in_terminal(self, i: int, f: Finding, r: Remedy, how: ApplyPlan, undoing: bool = False) -> None:
        """Hand the terminal over (sudo may ask for a password), then come back and report."""

        class NoTerminal(Exception):
            pass

        def terminal(argv: list[str], env: dict[str, str]) -> int:
            try:
                with self.app.suspend():
                    print(f"\nzdoctor: applying {r.title!r} ({'; '.join(how.reasons)})\n", flush=True)
                    # In zdoctor's own group (the terminal's foreground): an SSH drop's SIGHUP reaches it;
                    # the parent-death signal ends it if zdoctor is killed (not across sudo's set-user-ID).
                    code = subprocess.call(argv, env=env, preexec_fn=children.pdeathsig_hook())
                    print(f"\nzdoctor: exit code {code}. Press Enter to return to zdoctor.", flush=True)
                    with contextlib.suppress(EOFError):
                        input()
                    return code
            except SuspendNotSupported:
                raise NoTerminal from None

        try:
            outcome = run_remedy(r, training_env(self.ctx.host), terminal=terminal, env_file=self.env_file())
        except NoTerminal:
            note = "This terminal cannot be handed over; running without it (a password prompt will fail)."
            self.run_worker(partial(self.stream, i, f, r, note, undoing), group="apply", exclusive=True)
            return
        self.finish(i, f, r, outcome, undoing)

    def finish(self, i: int, f: Finding, r: Remedy, outcome: ApplyOutcome, undoing: bool = False) -> None:
        # A script of export/unset lines changes no shell that outlives it: what it did is the file written.
        written = outcome.ok and bool(outcome.env_file) and only_changes_the_shell(r.commands)
        record_remedy(self.ctx.record, "written" if written else "applied", self.playbook, self.node, f.id, r,
                      **outcome.to_dict(), ran_on=socket.gethostname())
        status = "written" if written else ("undone" if undoing else "applied") if outcome.ok else (
            "cancelled" if outcome.cancelled else "undo failed" if undoing else "failed")
        self.mark_done(i, status)
        headline = (written_text(outcome.env_file) if written else
                    f"{status}: exit code {outcome.exit_code}, {outcome.duration_s:.1f} s")
        text = Text.assemble(mark("ok" if outcome.ok else "fail"), " ", (headline, "bold"))
        if outcome.error:
            text.append(f"\n{outcome.error}", style="red")
        if not written:
            text.append("\nWhat changed: " + ("; ".join(outcome.changed) if outcome.changed else
                                              "no file named in the commands changed"))
        if outcome.env_file and not written:
            text.append(f"\nThe export/unset lines were {written_text(outcome.env_file)}.", style="bold")
        if outcome.env_file:
            text.append(f"\nBefore launching, run in that shell or job script:  source {outcome.env_file}",
                        style="bold")
        if r.undo and outcome.ok and not undoing:
            text.append(f"\nu undoes it ({' && '.join(r.undo)}), after a confirmation.", style="dim")
        text.append("\nRecorded in the session log; x exports the report.", style="dim")
        self.result(text)
        self.notify(f"{r.title}: {status}", severity="information" if outcome.ok else "error", timeout=5)

    def result(self, text: Text) -> None:
        box = self.query_one("#rem-result", Static)
        box.update(text)
        box.display = True

    def mark_done(self, i: int, status: str) -> None:
        self.outcomes[i] = status
        menu = self.query_one("#remedies", OptionList)
        f, r = self.pairs[i]
        menu.replace_option_prompt_at_index(self.option_at.get(i, i), self.option_text(i, f, r))

    def action_cancel(self) -> None:
        if self.running is None:
            self.notify("Nothing is running.", timeout=3)
            return
        self.running.set()

    def action_scroll_body(self, direction: int) -> None:
        body = self.query_one("#rem-body", VerticalScroll)
        (body.scroll_page_down if direction > 0 else body.scroll_page_up)(animate=False)

    def action_back(self) -> None:
        if self.running is not None:
            self.notify("A remedy is running: c cancels it first.", severity="warning")
            return
        self.app.pop_screen()
