"""A task's messages to the model as plain data, typed on demand.

A resumed task's history is thousands of messages. The runtime keeps them as
the dicts the log stores (their wire form, what `dump_message` wrote) and
builds a typed message (`UserMessage`, `AssistantMessage`, ...) only when
something reads it. Each is built once and kept for the runner's life, so a
model that reads every message pays for that once, and one that sends the wire
form (`OpenAIChat`, through `wire_messages`) never does.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import Any, overload

from pydantic import BaseModel, ValidationError

from duragent._heap import collector_paused
from duragent.errors import StoreCorrupt
from duragent.types import API_MESSAGES, AssistantMessage, ToolMessage, dump_message


class WorkingView:
    """The messages the model sees, growing as the task runs.

    Each message is kept as plain data (its wire form) and as its typed
    message, each made from the other the first time it is asked for: a
    resumed history comes as data, a message the runner appends comes typed.
    Only appended to: a `Messages` taken earlier keeps seeing exactly what it saw.
    """

    __slots__ = ("_data", "_dumped", "_typed", "_typed_upto")

    def __init__(self, data: list[dict[str, Any]] | None = None) -> None:
        self._data: list[dict[str, Any] | None] = [] if data is None else list(data)
        self._typed: list[Any] = [None] * len(self._data)
        self._typed_upto = 0  # every message before this index is typed
        self._dumped = len(self._data)  # every message before this index has its data

    def __len__(self) -> int:
        return len(self._data)

    def append(self, message: BaseModel) -> None:
        at = self._result_place(message) if isinstance(message, ToolMessage) else None
        if at is not None:  # a result that came before one of an earlier call
            self._data.insert(at, None)
            self._typed.insert(at, message)
            self._dumped = min(self._dumped, at)
            if self._typed_upto >= at:
                self._typed_upto += 1
            return
        if self._typed_upto == len(self._typed):
            self._typed_upto += 1
        self._data.append(None)
        self._typed.append(message)

    def _result_place(self, result: ToolMessage) -> int | None:
        """Where a tool result goes among the results after its assistant message, in
        the order of that message's calls (results are committed as tools finish):
        None for the end. Only the round's results are looked at, never earlier."""
        k = len(self._typed)
        while k > 0 and _result_id(self._at(k - 1)) is not None:
            k -= 1
        if k == len(self._typed) or k == 0:
            return None  # the first result of its round: at the end
        order = {c: n for n, c in enumerate(_call_ids(self._at(k - 1)) or ())}
        mine = order.get(result.tool_call_id, len(order))
        for i in range(k, len(self._typed)):
            if order.get(_result_id(self._at(i)) or "", len(order)) > mine:
                return i
        return None

    def _at(self, i: int) -> BaseModel | dict[str, Any] | None:
        typed = self._typed[i]
        return typed if typed is not None else self._data[i]

    def extend(self, messages: Sequence[BaseModel]) -> None:
        for message in messages:
            self.append(message)

    def messages(self, head: Sequence[BaseModel] = ()) -> Messages:
        """What one model call is asked: `head` (a system message, say), then the view now."""
        return Messages(tuple(head), self, len(self._data))

    def data(self, stop: int) -> list[dict[str, Any]]:
        """The plain data of messages 0..stop-1."""
        for i in range(self._dumped, stop):
            if self._data[i] is None:
                self._data[i] = dump_message(self._typed[i])
        self._dumped = max(self._dumped, stop)
        return self._data[:stop]  # type: ignore[return-value]

    def typed(self, start: int, stop: int) -> list[Any]:
        """The typed messages start..stop-1, building (in one call) those not built yet."""
        typed, upto = self._typed, self._typed_upto
        if stop > upto:
            missing = [i for i in range(max(start, upto), stop) if typed[i] is None]
            if missing:
                self._build(missing)
            if start <= upto:
                upto = stop
                while upto < len(typed) and typed[upto] is not None:
                    upto += 1
                self._typed_upto = upto
        return typed[start:stop]

    def _build(self, indexes: list[int]) -> None:
        try:
            with collector_paused():  # thousands of new objects, none of them garbage
                built = API_MESSAGES.validate_python([self._data[i] for i in indexes])
        except ValidationError as exc:
            raise StoreCorrupt(
                f"a stored message of the model's view is not a valid API message: {exc}"
            ) from exc
        for i, message in zip(indexes, built, strict=True):
            self._typed[i] = message


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
            h = len(self._head)
            start, stop, step = index.indices(h + self._stop)
            if step == 1 and start >= h:  # the common case, kept fast: a run of the view
                return self._view.typed(start - h, max(start, stop) - h)
            wanted = range(len(self))[index]
            if not wanted:
                return []
            lo, hi = max(min(wanted[0], wanted[-1]), h), max(wanted[0], wanted[-1]) + 1
            body = self._view.typed(lo - h, hi - h) if hi > lo else []
            return [self._head[i] if i < h else body[i - lo] for i in wanted]
        h = len(self._head)
        i = range(h + self._stop)[index]  # IndexError as a list raises it
        if i < h:
            return self._head[i]
        message = self._view._typed[i - h]  # the common case, kept fast: built already
        return message if message is not None else self._view.typed(i - h, i - h + 1)[0]

    def __iter__(self) -> Iterator[Any]:
        view = self._view
        if view._typed_upto < self._stop:
            view.typed(0, self._stop)
        # No copy of a long history (touching every message costs more than the
        # rest of a round), and no generator: iterated in C.
        body = itertools.islice(view._typed, self._stop)
        return itertools.chain(self._head, body) if self._head else body

    def typed_list(self) -> list[Any]:
        """The typed messages as a new list (in C: twice as fast as `list(messages)`)."""
        body = self._view.typed(0, self._stop)
        return [*self._head, *body] if self._head else body

    def wire(self) -> list[dict[str, Any]]:
        """The messages as the OpenAI chat API takes them; shared, not to be changed."""
        return [dump_message(m) for m in self._head] + self._view.data(self._stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Messages | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Messages({list(self)!r})"


def typed_list(messages: Sequence[Any]) -> list[Any]:
    """Typed messages, or a `Messages`, as a new list of typed messages."""
    return messages.typed_list() if isinstance(messages, Messages) else list(messages)


def wire_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Typed messages, or a `Messages`, in the OpenAI chat API's wire form."""
    if isinstance(messages, Messages):
        return messages.wire()
    return [dump_message(m) for m in messages]


# --- tool results in the order of their calls ---------------------------------
# A round's results are committed as its tools finish, so the log holds them in
# completion order; providers (and peers) expect them in the order of the
# assistant message's calls. Messages here are typed or in their wire form.


def _call_ids(message: Any) -> list[str] | None:
    """The call ids of an assistant message, in order; None for any other message."""
    if isinstance(message, dict):
        if message.get("role") != "assistant":
            return None
        return [c["id"] for c in message.get("tool_calls") or ()]
    if isinstance(message, AssistantMessage):
        return [c.id for c in message.tool_calls or ()]
    return None


def _result_id(message: Any) -> str | None:
    """The call id a tool result answers; None for any other message."""
    if isinstance(message, dict):
        return message.get("tool_call_id") if message.get("role") == "tool" else None
    return message.tool_call_id if isinstance(message, ToolMessage) else None


def in_call_order(messages: Sequence[Any]) -> list[Any]:
    """`messages` with each run of tool results after an assistant message in the
    order of that message's calls (a stable sort; a result of no call of it last).

    Runs on a resume's whole history: unless a message made two calls or more
    (a round of one call has one result) it costs `_most_calls`, and a copy is
    made only when a round's results are out of order.
    """
    out = messages if type(messages) is list else list(messages)
    if _most_calls(out) < 2:
        return out  # no round with parallel calls: the common case
    # A model's fields live in its __dict__: getattr of a field a message kind
    # lacks goes through pydantic's slow __getattr__ (~1 µs a message).
    calls_of: list[Any] = [
        m.get("tool_calls") if type(m) is dict else m.__dict__.get("tool_calls") for m in out
    ]
    copied = out is not messages
    n = len(out)
    # Only results move, never a message with calls, so calls_of stays true.
    for i in itertools.compress(range(n), calls_of):
        calls = calls_of[i]
        if len(calls) < 2:
            continue
        ids = []
        j = i + 1
        while j < n and (result_id := _result_id(out[j])) is not None:
            ids.append(result_id)
            j += 1
        call_ids = [_call_id(c) for c in calls]
        if ids == call_ids[: len(ids)]:
            continue  # in order already (the common case: checked cheaply)
        order = {c: k for k, c in enumerate(call_ids)}
        last = len(order)
        keys = [order.get(r, last) for r in ids]
        if all(a <= b for a, b in itertools.pairwise(keys)):
            continue  # in order, some calls unanswered
        if not copied:
            out, copied = list(out), True
        ranked = sorted(zip(keys, out[i + 1 : j], strict=True), key=lambda kr: kr[0])
        out[i + 1 : j] = [r for _k, r in ranked]
    return out


_FIELDS = operator.attrgetter("__dict__")


def _most_calls(messages: list[Any]) -> int:
    """The most tool calls one message makes, read by builtins (map, filter, max),
    at half the cost of a Python loop over a resume's thousands of messages,
    when they are all plain data or all typed; 2 (look at each) otherwise."""
    fields = messages if not messages or type(messages[0]) is dict else map(_FIELDS, messages)
    try:
        calls = filter(None, map(dict.get, fields, itertools.repeat("tool_calls")))
        return max(map(len, calls), default=0)
    except (TypeError, AttributeError):  # mixed, or calls that are no list
        return 2


def _call_id(call: Any) -> str:
    return str(call["id"] if type(call) is dict else call.id)
