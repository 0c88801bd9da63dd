"""Text for the terminal: what a model, a web page or an API client wrote, made inert.

Such text may hold terminal commands (an OSC sequence renames the window, a CSI
one clears the screen or moves the cursor) and, for Rich, markup. Everything the
CLI prints that it did not write itself goes through `safe` (for Rich markup)
or `clean` (for plain output); the CLI's consoles (`SafeConsole`) and log lines
(`CleanFormatter`) clean whatever reaches them again, so a value that was
missed still arrives inert.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

# ESC or its 8-bit C1 twin, then the rest of the sequence:
# - OSC, DCS, SOS, PM, APC: a string up to its terminator (BEL or ST), or to the
#   end of the text when it never ends (a terminal would swallow the rest too);
# - CSI: parameters, intermediates, one final byte;
# - any other escape: its intermediates and one final byte.
_SEQUENCE = re.compile(
    r"""
    (?: \x1b[\]PX^_] | [\x9d\x90\x98\x9e\x9f] ) .*? (?: \x07 | \x1b\\ | \x9c | \Z )
  | (?: \x1b\[ | \x9b ) [\x30-\x3f]* [\x20-\x2f]* [\x40-\x7e]?
  | \x1b [\x20-\x2f]* [\x30-\x7e]?
    """,
    re.VERBOSE | re.DOTALL,
)
# What is left of the controls: C0 but tab and newline, DEL, C1.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: object) -> str:
    """`text` without terminal control sequences or control characters (tab and newline stay)."""
    return _CONTROL.sub("", _SEQUENCE.sub("", str(text)))


def safe(text: object) -> str:
    """`text` to put in Rich markup: cleaned, and its brackets shown as written."""
    return escape(clean(text))


class SafeConsole(Console):
    """A Rich console that cleans every piece of text it writes, whatever the caller
    passed: a value printed without `safe`, or one a renderable (a table cell, a
    title) carries, reaches the terminal without its control sequences. Rich's own
    styles and cursor controls, which it writes around the text, stay."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(clean(segment.text), segment.style)
            for segment in buffer
        )


class CleanFormatter(logging.Formatter):
    """Log lines for a terminal: the record's text (a task's error, a name an API
    client chose) without control sequences; newlines stay, so a traceback asked
    for (DEBUG) keeps its shape."""

    def format(self, record: logging.LogRecord) -> str:
        return clean(super().format(record))
