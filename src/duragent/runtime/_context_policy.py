"""`ContextPolicy`: how a task's view is kept inside the model's context window.

An Agent's `context` option (on by default). The runtime acts on it at the
start of each round and when a provider refuses a request as too long
(runtime/_compaction.py): old, large tool results are elided first, then the
oldest rounds are summarised, each step a committed `compaction` entry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from duragent.errors import InvalidOption, check_count
from duragent.llm._base import ChatModel

SUMMARY_PROMPT = (
    "You compress the history of an agent's task so that it can go on without it. "
    "Write a concise summary of the conversation below: the user's goal, what was "
    "done (tool calls and their key results: names, numbers, paths, identifiers), "
    "what was decided, what failed and what is still to do. Keep every fact the "
    "agent will need later; drop chatter. Answer with the summary only."
)

MAX_SUMMARY_CHARS = 200_000  # a summary longer than this is no compaction

# A user function that compacts instead of the summariser: given the messages to
# replace (wire-form dicts, oldest first), it returns the summary text, or the
# messages to stand for them. Sync or async.
CompactFn = Callable[[list[dict[str, Any]]], "str | list[dict[str, Any]] | Awaitable[Any]"]


@dataclass(frozen=True, kw_only=True)
class ContextPolicy:
    """When and how a task's model view is compacted to fit the context window.

    The window comes from `window`, else from the model's name (a table of
    common models in `duragent.llm._windows`); a model it does not know is
    compacted only when its provider answers that a request was too long.
    """

    enabled: bool = True
    """False: never compact (an overflow then fails the task)."""
    window: int | None = None
    """The model's context window in tokens; None: from the model's name."""
    threshold: float = 0.8
    """Compact when the next request would pass this share of the window."""
    target: float = 0.5
    """Compact down to this share of the window (what a compaction aims for)."""
    keep_rounds: int = 4
    """The newest rounds kept verbatim (fewer only when the window demands it)."""
    keep_first_user: bool = True
    """Keep the task's first user message verbatim (the instructions of the task)."""
    elide_over: int = 2_000
    """Characters: an older tool result longer than this is elided first."""
    summarizer: ChatModel | None = None
    """The model that writes summaries; None: the agent's own model."""
    summary_prompt: str = SUMMARY_PROMPT
    summary_chars: int = 4_000
    """The longest summary kept (characters); a longer one is cut."""
    pinned: Callable[[Mapping[str, Any]], bool] | None = None
    """Messages (wire-form dicts) to keep verbatim however old: `pinned(message)`."""
    compact: CompactFn | None = None
    """A function that replaces the summariser (see `CompactFn`)."""
    chars_per_token: float = 4.0
    """The estimate until the provider's own counts calibrate it (per task)."""
    windows: Mapping[str, int] = field(default_factory=dict)
    """More model name prefixes and their windows, over the built-in table."""

    def __post_init__(self) -> None:
        if self.window is not None:
            check_count("ContextPolicy.window", self.window, least=256)
        check_count("ContextPolicy.keep_rounds", self.keep_rounds, least=0)
        check_count("ContextPolicy.elide_over", self.elide_over, least=0)
        if not 0 < self.target < self.threshold <= 1:
            raise InvalidOption(
                "ContextPolicy needs 0 < target < threshold <= 1 "
                f"(got target={self.target}, threshold={self.threshold})"
            )
        cpt = self.chars_per_token
        if isinstance(cpt, bool) or not isinstance(cpt, int | float) or not 0.5 <= cpt <= 100:
            raise InvalidOption(
                f"ContextPolicy.chars_per_token is a number from 0.5 to 100, not {cpt!r}"
            )
        if not isinstance(self.windows, Mapping):
            raise InvalidOption(
                f"ContextPolicy.windows maps model name prefixes to windows, not {self.windows!r}"
            )
        for name, size in self.windows.items():
            if not isinstance(name, str) or not name:
                raise InvalidOption(f"ContextPolicy.windows: a key is a model name, not {name!r}")
            check_count(f"ContextPolicy.windows[{name!r}]", size, least=256, of="tokens")
        check_count("ContextPolicy.summary_chars", self.summary_chars, least=100)
        if self.summary_chars > MAX_SUMMARY_CHARS:
            raise InvalidOption(
                f"ContextPolicy.summary_chars is at most {MAX_SUMMARY_CHARS}, "
                f"not {self.summary_chars}"
            )
