"""How tasks and their entries look on the terminal: status colours, one line per entry,
and the timeline table shared by `duragent show` and `duragent demo`.

Everything here that a model, a web page or an API client wrote goes through
`safe` (Rich markup) or `clean` (plain text, `rich.text.Text`).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from duragent._payloads import (
    api_of,
    checkpoint_of,
    compaction_of,
    handoff_of,
    intent_of,
    progress_of,
    result_of,
    rollback_of,
    status_of,
)
from duragent._terminal import clean, safe
from duragent.types import Entry, EntryKind, Task, utcnow

STATUS_STYLE = {
    "pending": "cyan",
    "running": "bold blue",
    "paused": "yellow",
    "waiting": "magenta",
    "completed": "green",
    "failed": "bold red",
    "aborted": "red",
    "blocked": "bold yellow",
}


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 round`, `3 rounds`: a number and its noun, in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def when(dt: datetime | None) -> str:
    return "" if dt is None else dt.strftime("%Y-%m-%d %H:%M:%S")


def status_text(task: Task) -> str:
    """The task's status, and its reason if it has one: `waiting (approval)`."""
    return task.status.value + (f" ({task.status_reason})" if task.status_reason else "")


def status_markup(task: Task) -> str:
    """`status_text` in the status's colour, as Rich markup."""
    return f"[{STATUS_STYLE.get(task.status.value, '')}]{safe(status_text(task))}[/]"


def step(task: Task) -> str:
    if task.status.terminal:
        return f"{task.iterations} done"
    return f"{task.iterations + 1}"


def lease_left(task: Task) -> str:
    """How long the task's current lease still holds it: `14 s (held by host:123 until
    09:10:11)`. After a crash, no one may take the task over before that."""
    expires = task.lease.expires_at
    assert expires is not None
    seconds = max(0, math.ceil((expires - utcnow()).total_seconds()))
    return f"{seconds} s (held by {clean(task.lease.owner or '?')} until {expires:%H:%M:%S} UTC)"


def clip(value: Any, n: int = 60) -> str:
    """`value` (JSON unless a string) on one line, at most `n` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def describe(e: Entry) -> str:
    """One line saying what an entry records (not yet cleaned for the terminal)."""
    p = e.payload
    if e.kind is EntryKind.API_MESSAGE:
        m = api_of(e)
        if m["role"] == "assistant":
            calls = ", ".join(c["function"]["name"] for c in m.get("tool_calls") or ())
            said = clip(m.get("content") or "", 70)
            return f"assistant: {said}" + (f"  → calls {calls}" if calls else "")
        return f"{m['role']}: {clip(m.get('content'), 70)}"
    if e.kind is EntryKind.TOOL_INTENT:
        i = intent_of(e)
        return f"intent {i['name']} ({i['call_id']}, replay={i.get('replay')})"
    if e.kind is EntryKind.TOOL_RESULT:
        r = result_of(e)
        return f"result {r['tool_call_id']} [{r.get('outcome')}]: {clip(r['content'])}"
    if e.kind is EntryKind.PROGRESS:
        pr = progress_of(e)
        who = f"tool {pr['call_id']} " if "call_id" in pr else ""
        if "event" in pr:
            return f"{who}event {pr['event']}: {clip(json.dumps(pr.get('data')), 70)}"
        return f"{who}streamed '{clip(pr.get('text', ''), 70)}'"
    if e.kind is EntryKind.STATUS:
        st = status_of(e)
        if isinstance(moved := st.get("migration"), dict):
            by = f" by {moved['by']}" if moved.get("by") else ""
            return f"migration {moved.get('from') or '(any)'} → {moved.get('to')}{by}"
        line = f"status {st['from']} → {st['to']}"
        if st.get("reason"):
            line += f" ({st.get('reason')})"
        if st.get("takeover"):
            line += " (took over from a dead worker)"
        if st.get("error"):
            line += f": {clip(st.get('error'))}"
        return line
    if e.kind is EntryKind.HANDOFF:
        h = handoff_of(e)
        return f"handoff {h['from']} → {h['to']} ({h['call_id']})"
    if e.kind is EntryKind.ROLLBACK:
        rb = rollback_of(e)
        return f"rollback ({rb.get('scope', 'api')}) of seqs {rb['from_seq']}–{rb['to_seq']}"
    if e.kind is EntryKind.CHECKPOINT:
        c = checkpoint_of(e)
        if c["type"] == "wait":
            what = c.get("question") or c.get("child_id") or c.get("wake_at") or ""
            return f"waits for {c['wait']} ({c['call_id']}): {clip(what)}"
        if c["type"] == "decision":
            verdict = f"{'approved' if c['approved'] else 'denied'} {c['call_id']}"
            if c.get("arguments") is not None:
                verdict += f" with edited arguments {clip(c.get('arguments'), 50)}"
            return verdict + (f": {c['reason']}" if c["reason"] else "")
        if c["type"] == "guardrail":
            said = f"tripped ({c['action']}): {clip(c['message'])}" if c["tripwire"] else "passed"
            return f"{c['stage']} guardrail {c['name']} on #{c['checked_seq']}: {said}"
        return f"{c['type']} {p.get('call_id', '')}".strip()  # started, step, fork, message, ...
    if e.kind is EntryKind.COMPACTION:
        cp = compaction_of(e)
        how = "summarised" if cp["how"] != "elided" else f"{cp.get('elided', 0)} results elided"
        line = f"compaction: rounds {cp['from_round']}–{cp['to_round']} {how} (seqs ≤ {cp['upto']})"
        return line + (f": {clip(cp['summary'], 2_000)}" if cp.get("summary") else "")
    if e.kind is EntryKind.UI_MESSAGE:
        text = p.get("message") or p.get("text") or ""
        return f"{p.get('type', 'ui')}: {clip(text, 70)}" + (
            f" — {clip(p['detail'])}" if p.get("detail") else ""
        )
    return clip(p, 80)


BEFORE, AFTER = "before kill", "after restart"


def timeline(
    entries: list[Entry], *, title: str = "Committed entries", restarted_after: int | None = None
) -> Table:
    """The log as a table; consecutive progress batches of one stream collapse into a row.

    With `restarted_after` (the last seq committed before a crash), a `phase`
    column says which side of the restart each entry is on, and the entries
    after it are highlighted.
    """
    table = Table(title=title, title_justify="left")
    columns = ["seq", "round", "kind", "at"] + (["phase"] if restarted_after is not None else [])
    for col in [*columns, "what"]:
        table.add_column(col, no_wrap=col != "what")
    rows: list[list[str]] = []
    last_stream: tuple[int, str] | None = None
    for e in entries:
        p = e.payload
        phase = "" if restarted_after is None else BEFORE if e.seq <= restarted_after else AFTER
        streamed = e.kind is EntryKind.PROGRESS and "call_id" not in p
        if streamed and last_stream == (e.round, phase) and rows:
            row = rows[-1]
            row[0] = f"{row[0].split('–')[0]}–{e.seq}"
            row[-1] = row[-1][:-1] + clean(progress_of(e).get("text", "")) + "'"
            continue
        last_stream = (e.round, phase) if streamed else None
        what = (
            f"streamed '{clean(progress_of(e).get('text', ''))}'"
            if streamed
            else clean(describe(e))
        )
        at = e.created_at.strftime("%H:%M:%S.%f")[:-3]
        row = [str(e.seq), str(e.round or "-"), e.kind.value, at]
        rows.append([*row, phase, what] if restarted_after is not None else [*row, what])
    for row in rows:
        # Text, not markup: pieces escaped one by one could join into a live tag
        # ("x [lin" + "k=...]"), so the joined text is never parsed at all.
        style = "yellow" if restarted_after is not None and row[4] == AFTER else None
        table.add_row(*row[:-1], Text(row[-1]), style=style)
    return table
