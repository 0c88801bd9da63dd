"""Entry payloads: the shape of each `EntryKind`'s payload, and the void rule.

Each kind's payload is a TypedDict, checkpoints a union tagged by `type`. They
describe the stored JSON as it is (no migration: an old log reads the same)
and cost nothing at run time: a reader takes `entry.payload` through a typed
accessor (`intent_of`, `result_of`, `checkpoint_of`, ...) and mypy checks
every key it reads. Validation is there for who wants it, off the hot paths
(`validate_checkpoint`); the model view and the commit path never
validate per entry.

A rollback marker hides a range of seqs in one scope and never deletes them:
`api` takes entries out of the model's view (a rolled-back round, an edited
fork), `progress` drops a stream's partial text, `ui` hides a deleted UI
message. Every reader that asks "is this entry hidden?" asks here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired, cast

from pydantic import Field, TypeAdapter
from typing_extensions import TypedDict  # pydantic validates only this one on 3.11

if TYPE_CHECKING:
    from duragent.types import Entry, NewEntry

VoidScope = Literal["api", "progress", "ui"]
WaitKind = Literal["timer", "input", "approval", "subtask"]


class IntentPayload(TypedDict):
    """`tool_intent`: the model asked for this call (written before it runs)."""

    call_id: str
    name: str
    replay: NotRequired[str]  # "safe" | "never" | ...: whether recovery may run it again


class ResultPayload(TypedDict):
    """`tool_result`: the tool message the model sees plus how the call ended."""

    role: Literal["tool"]
    tool_call_id: str
    content: str
    outcome: NotRequired[str]  # "ok", "error", "interrupted", "rolled_back", ...


class FunctionPayload(TypedDict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCallPayload(TypedDict):
    id: str
    type: NotRequired[str]
    function: FunctionPayload


class ApiPayload(TypedDict):
    """`api_message`: an API message in its wire form (`types.ApiMessage` dumped).

    The model view reads these as plain data on resume (`Store.model_view_data`);
    this describes the keys the UI and the CLI read from them.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: NotRequired[str | None]  # absent on an assistant message that only calls
    tool_calls: NotRequired[list[ToolCallPayload]]
    tool_call_id: NotRequired[str]


class ProgressPayload(TypedDict, total=False):
    """`progress`: streamed text of the model (no call id) or of a tool call, or
    a custom event a tool emitted (`ctx.emit`: `event`, `data`, and `n`, its
    number among the call's events, which makes it once across re-runs)."""

    text: str
    call_id: str
    event: str
    data: Any
    n: int


class RollbackPayload(TypedDict):
    """`rollback` (and a `ui_message` with `scope: "ui"`): hides seqs in a scope."""

    scope: NotRequired[VoidScope]  # absent in old logs: "api"
    from_seq: int
    to_seq: int
    reason: NotRequired[str]


# `handoff`: the model of the entry's round took agent `from`'s transfer tool (call
# `call_id`) to agent `to`; from the next round on, `to` runs the task
# (runtime/_handoffs.py). Committed with the call's result, right after it.
HandoffPayload = TypedDict("HandoffPayload", {"call_id": str, "from": str, "to": str})


class CompactionPayload(TypedDict):
    """`compaction`: the model's view of every entry with seq <= `upto` is `head`.

    The last compaction of a log wins; its head is what stands, in the model's
    view, for everything before it (earlier compactions included). Nothing is
    deleted: the page, history, export and forks read the entries themselves.
    """

    upto: int
    head: list[ApiPayload]
    how: str  # "elided" (large tool results shortened), "summarised", "custom"
    from_round: int  # the rounds the head stands for
    to_round: int
    kept: NotRequired[int]  # the head's first messages kept verbatim (the first user message)
    summary: NotRequired[str]
    elided: NotRequired[int]  # how many tool results were shortened
    reason: NotRequired[str]  # "threshold" or "overflow"
    tokens_before: NotRequired[int]  # the estimates the decision was made on
    tokens_after: NotRequired[int]


StatusPayload = TypedDict(
    "StatusPayload",
    {
        "from": str,
        "to": str,
        "reason": NotRequired[str],
        "error": NotRequired[str],
        "epoch": NotRequired[int],
        "worker": NotRequired[str],  # a claim: who took the task
        "takeover": NotRequired[bool],  # a claim of a task whose owner's lease ran out
        "released": NotRequired[bool],
    },
)
StatusPayload.__doc__ = "`status`: a change of the task's status."


class WaitCheckpoint(TypedDict):
    """A call suspended: on a timer, a person (input, approval) or a sub-task."""

    type: Literal["wait"]
    call_id: str
    wait: WaitKind
    wake_at: NotRequired[str]  # timer: ISO time
    question: NotRequired[str]  # input, approval
    tool: NotRequired[str]  # approval of a tool call
    arguments: NotRequired[dict[str, Any]]
    timeout: NotRequired[float | None]
    expires_at: NotRequired[str]  # approval with a time limit: ISO time
    # An approval the tool asked for itself (a hosted loop's tool): once decided,
    # either way, the call runs again and reads the decision.
    rerun: NotRequired[bool]
    child_id: NotRequired[str]  # subtask
    agent: NotRequired[str]


class DecisionCheckpoint(TypedDict):
    """A person's decision on an approval; `arguments` when they edited the call's."""

    type: Literal["decision"]
    call_id: str
    approved: bool
    reason: str | None
    arguments: NotRequired[dict[str, Any]]


class StartedCheckpoint(TypedDict):
    type: Literal["started"]
    call_id: str


class StepCheckpoint(TypedDict):
    """A durable step inside a tool finished: its `value` or its `error`."""

    type: Literal["step"]
    call_id: str
    step: str
    value: NotRequired[Any]
    error: NotRequired[Any]


class StepStartedCheckpoint(TypedDict):
    type: Literal["step_started"]
    call_id: str
    step: str


class ForkCheckpoint(TypedDict):
    """The first entry of a fork: its source, round and edit."""

    type: Literal["fork"]
    task_id: str
    round: int
    edit: dict[str, Any] | None


class MessageCheckpoint(TypedDict):
    """A message sent to a running task, queued until it is delivered."""

    type: Literal["message"]
    id: str
    text: str
    strategy: str
    request_id: NotRequired[str]


class DeliveredCheckpoint(TypedDict):
    type: Literal["delivered"]
    message_id: str


Stage = Literal["input", "output"]


class GuardrailCheckpoint(TypedDict):
    """A guardrail's verdict on the entry `checked_seq` (the task's input, or a final
    answer), committed before anything acts on it (runtime/_guardrails.py)."""

    type: Literal["guardrail"]
    stage: Stage
    name: str
    checked_seq: int
    tripwire: bool
    message: str
    action: Literal["fail", "correct"]
    info: NotRequired[Any]


Checkpoint = Annotated[
    WaitCheckpoint
    | DecisionCheckpoint
    | StartedCheckpoint
    | StepCheckpoint
    | StepStartedCheckpoint
    | ForkCheckpoint
    | MessageCheckpoint
    | DeliveredCheckpoint
    | GuardrailCheckpoint,
    Field(discriminator="type"),
]


@functools.cache
def _checkpoint_adapter() -> TypeAdapter[Checkpoint]:
    return TypeAdapter(Checkpoint)


def validate_checkpoint(payload: Any) -> Checkpoint:
    """A checkpoint payload checked against its tag's shape (`ValidationError` if not).

    For tests and tools, off the hot paths: the runtime reads through the
    accessors below and never validates per entry.
    """
    return _checkpoint_adapter().validate_python(payload)


# --- typed accessors: no copy, no validation -----------------------------------


def stored(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A typed payload as an entry's `payload` (the same dict: a TypedDict is one)."""
    return cast(dict[str, Any], payload)


def api_of(entry: Entry | NewEntry) -> ApiPayload:
    return cast(ApiPayload, entry.payload)


def intent_of(entry: Entry | NewEntry) -> IntentPayload:
    return cast(IntentPayload, entry.payload)


def result_of(entry: Entry | NewEntry) -> ResultPayload:
    return cast(ResultPayload, entry.payload)


def progress_of(entry: Entry | NewEntry) -> ProgressPayload:
    return cast(ProgressPayload, entry.payload)


def rollback_of(entry: Entry | NewEntry) -> RollbackPayload:
    return cast(RollbackPayload, entry.payload)


def handoff_of(entry: Entry | NewEntry) -> HandoffPayload:
    return cast(HandoffPayload, entry.payload)


def compaction_of(entry: Entry | NewEntry) -> CompactionPayload:
    return cast(CompactionPayload, entry.payload)


def status_of(entry: Entry | NewEntry) -> StatusPayload:
    return cast(StatusPayload, entry.payload)


def wait_of(entry: Entry | NewEntry) -> WaitCheckpoint:
    """A checkpoint the caller knows is a wait (it just built it, or read its tag)."""
    return cast(WaitCheckpoint, entry.payload)


def checkpoint_of(entry: Entry | NewEntry) -> Checkpoint:
    """A checkpoint's payload; narrow it on `["type"]` (mypy follows the tag)."""
    return cast(Checkpoint, entry.payload)


def rollback_marker(scope: VoidScope, from_seq: int, to_seq: int, reason: str) -> dict[str, Any]:
    """The payload of a marker hiding seqs `from_seq`..`to_seq` in `scope`."""
    return {"scope": scope, "from_seq": from_seq, "to_seq": to_seq, "reason": reason}


def is_marker(payload: Mapping[str, Any]) -> bool:
    """A rollback marker, not a message: what a `ui_message` entry that deletes one is."""
    return "from_seq" in payload


def voided_ranges(
    markers: Iterable[Mapping[str, Any]], scope: VoidScope = "api"
) -> list[tuple[int, int]]:
    """The seq ranges the markers of `scope` hide (a marker without a scope is `api`).

    Payloads that are not markers (no `from_seq`) are skipped, so a reader can
    pass every UI payload and get the deletions among them.
    """
    return [
        (m["from_seq"], m["to_seq"])
        for m in markers
        if is_marker(m) and m.get("scope", "api") == scope
    ]


def is_voided(seq: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(lo <= seq <= hi for lo, hi in ranges)
