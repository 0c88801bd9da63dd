"""How `duragent run` shows a task as it runs: the model's text as it streams,
a card for each tool call and its outcome, and the notices on the way."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rich.console import Console

from duragent._payloads import api_of, handoff_of, progress_of, result_of, rollback_of, status_of
from duragent._terminal import safe
from duragent.types import Entry, EntryKind

# The UI errors that say a task ended; TerminalRun.summary (cli/_run.py) says that,
# with the error.
ENDINGS = ("The task failed.", "The task is blocked.")


def _args(arguments: str, limit: int = 120) -> str:
    try:
        value = json.loads(arguments or "{}")
        text = ", ".join(f"{k}={v!r}" for k, v in value.items())
    except (ValueError, AttributeError):
        text = arguments
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class Transcript:
    """Prints committed entries: the model's text as it streams, tool cards, notices."""

    console: Console
    streamed: dict[int, str] = field(default_factory=dict)  # round -> text shown so far
    tools: dict[str, str] = field(default_factory=dict)  # call id -> tool name
    open_line: bool = False

    def end_line(self) -> None:
        if self.open_line:
            self.console.print()
            self.open_line = False

    def _text(self, text: str) -> None:
        if text:
            self.console.print(safe(text), end="", soft_wrap=True)
            self.open_line = not text.endswith("\n")

    def show(self, e: Entry) -> None:
        p = e.payload
        if e.kind is EntryKind.PROGRESS and "call_id" not in p:
            text = progress_of(e).get("text", "")
            if e.round not in self.streamed:
                self.end_line()
            self.streamed[e.round] = self.streamed.get(e.round, "") + text
            self._text(text)
        elif e.kind is EntryKind.ROLLBACK and rollback_of(e).get("scope") == "progress":
            if self.streamed.pop(e.round, None) is not None:
                self.end_line()
                self.console.print("[dim](the interrupted answer above is discarded)[/]")
        elif e.kind is EntryKind.API_MESSAGE and (m := api_of(e))["role"] == "assistant":
            shown = self.streamed.pop(e.round, "")
            content = m.get("content") or ""
            if shown and content.startswith(shown):
                self._text(content[len(shown) :])
            else:
                self.end_line()
                self._text(content)
            self.end_line()
            for call in m.get("tool_calls") or ():
                name = call["function"]["name"]
                self.tools[call["id"]] = name
                args = _args(call["function"]["arguments"])
                self.console.print(f"[cyan]⚙ {safe(name)}[/]({safe(args)})")
        elif e.kind is EntryKind.TOOL_RESULT:
            self.end_line()
            result = result_of(e)
            name = self.tools.get(result["tool_call_id"], "tool")
            outcome = result.get("outcome", "ok")
            mark, style = {
                "ok": ("✓", "green"),
                "interrupted": ("⚠", "yellow"),
                "denied": ("✗", "yellow"),
            }.get(outcome, ("✗", "red"))
            said = safe(_first_line(result["content"]))
            self.console.print(f"  [{style}]{mark} {safe(name)} {outcome}[/]: {said}")
        elif e.kind is EntryKind.HANDOFF:
            self.end_line()
            h = handoff_of(e)
            self.console.print(f"[magenta]⇄ handoff: {safe(h['from'])} → {safe(h['to'])}[/]")
        elif e.kind is EntryKind.STATUS and status_of(e).get("takeover"):
            self.end_line()
            self.console.print("[yellow]• took the task over from its previous owner[/]")
        elif e.kind is EntryKind.UI_MESSAGE:
            self.end_line()
            if p.get("type") == "error":
                if p.get("message") in ENDINGS:
                    return  # the summary says how the task ended, with its error: once
                message = str(p.get("message", ""))
                detail = f": {p['detail']}" if p.get("detail") else ""
                if detail:
                    message = message.rstrip(".")
                self.console.print(f"[red]✗ {safe(message + detail)}[/]")
            elif p.get("type") == "notice":
                self.console.print(f"[yellow]• {safe(p.get('message', ''))}[/]")
