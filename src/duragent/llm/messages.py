"""A task's messages to the model as plain data, typed on demand.

A resumed task's history is thousands of messages. The runtime keeps them as
the dicts the log stores (their wire form, what `dump_message` wrote) and
builds a typed message (`UserMessage`, `AssistantMessage`, ...) only when
something reads it. Each is built once and kept for the runner's life, so a
model that reads every message pays for that once, and one that sends the wire
form (`OpenAIChat`, through `wire_messages`) never does.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from typing import Any, overload

from pydantic import BaseModel, ValidationError

from duragent.errors import StoreCorrupt
from duragent.types import API_MESSAGES, dump_message


class WorkingView:
    """The messages the model sees, growing as the task runs.

    Plain dicts, each with its typed message once built. Only appended to: a
    `Messages` taken earlier keeps seeing exactly what it saw.
    """

    __slots__ = ("_data", "_typed")

    def __init__(self, data: list[dict[str, Any]] | None = None) -> None:
        self._data: list[dict[str, Any]] = [] if data is None else data
        self._typed: list[Any] = [None] * len(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def append(self, message: BaseModel) -> None:
        self._data.append(dump_message(message))
        self._typed.append(message)

    def messages(self, head: Sequence[BaseModel] = ()) -> Messages:
        """What one model call is asked: `head` (a system message, say), then the view now."""
        return Messages(tuple(head), self, len(self._data))

    def typed(self, start: int, stop: int) -> list[Any]:
        """The typed messages start..stop-1, building (in one call) those not built yet."""
        missing = [i for i in range(start, stop) if self._typed[i] is None]
        if missing:
            enabled = gc.isenabled()
            gc.disable()  # thousands of new objects, none of them garbage
            try:
                built = API_MESSAGES.validate_python([self._data[i] for i in missing])
            except ValidationError as exc:
                raise StoreCorrupt(
                    f"a stored message of the model's view is not a valid API message: {exc}"
                ) from exc
            finally:
                if enabled:
                    gc.enable()
            for i, message in zip(missing, built, strict=True):
                self._typed[i] = message
        return self._typed[start:stop]


class Messages(Sequence[Any]):
    """The messages of one model call: typed messages (ApiMessage models) when
    read, the plain wire form from `wire()` without building any."""

    __slots__ = ("_head", "_stop", "_view")

    def __init__(self, head: tuple[BaseModel, ...], view: WorkingView, stop: int) -> None:
        self._head = head
        self._view = view
        self._stop = stop

    def __len__(self) -> int:
        return len(self._head) + self._stop

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            wanted = range(len(self))[index]
            if not wanted:
                return []
            h = len(self._head)
            lo, hi = max(min(wanted), h), max(wanted) + 1
            body = self._view.typed(lo - h, hi - h) if hi > lo else []
            return [self._head[i] if i < h else body[i - lo] for i in wanted]
        i = range(len(self))[index]  # IndexError as a list raises it
        h = len(self._head)
        return self._head[i] if i < h else self._view.typed(i - h, i - h + 1)[0]

    def __iter__(self) -> Iterator[Any]:
        yield from self._head
        yield from self._view.typed(0, self._stop)

    def wire(self) -> list[dict[str, Any]]:
        """The messages as the OpenAI chat API takes them; shared, not to be changed."""
        return [dump_message(m) for m in self._head] + self._view._data[: self._stop]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Messages | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Messages({list(self)!r})"


def wire_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Typed messages, or a `Messages`, in the OpenAI chat API's wire form."""
    if isinstance(messages, Messages):
        return messages.wire()
    return [dump_message(m) for m in messages]
