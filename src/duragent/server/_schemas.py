"""Request and response bodies of the HTTP API (so /openapi.json tells the truth)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from duragent._payloads import WaitKind
from duragent.runtime._agent import Agent
from duragent.runtime._approvals import Decision
from duragent.runtime._inbox import MultitaskStrategy
from duragent.runtime._presence import Sighting
from duragent.runtime._reading import TaskTree
from duragent.runtime._sessions import SessionSummary
from duragent.runtime._views import Steps
from duragent.types import ApiMessage, Entry, Task, TaskStatus, UIMessage, Usage

# Enums the document defines once, as components (server/_openapi.py adds them).
NAMED_ENUMS: dict[str, dict[str, Any]] = {}


def named(alias: Any, name: str, description: str) -> WithJsonSchema:
    """`Annotated[alias, named(alias, ...)]`: the Literal `alias` in the schema as a
    reference to the component `name`, defined once."""
    enum = list(get_args(alias))
    NAMED_ENUMS[name] = {"type": "string", "enum": enum, "description": description}
    # allOf: a bare $ref beside the field's title is looked up among pydantic's own models.
    return WithJsonSchema({"allOf": [{"$ref": f"#/components/schemas/{name}"}]})


Strategy = Annotated[
    MultitaskStrategy,
    named(
        MultitaskStrategy,
        "MultitaskStrategy",
        "What a new message does while a turn runs: enqueue (after the turn's answer), "
        "reject (409), interrupt (stop at the next safe point, then go on with it), "
        "rollback (the same, the round in progress rolled back).",
    ),
]
WaitKindName = Annotated[WaitKind, named(WaitKind, "WaitKind", "What an open wait waits for.")]
StatusReason = Literal[
    "input",
    "timer",
    "subtask",
    "restart_limit",
    "missing_definition",
    "incompatible_store",
    "pinned",
    "lost_commits",
    "deadline",
    "guardrail",
    "output_invalid",
]
StatusReasonName = Annotated[
    StatusReason,
    named(
        StatusReason,
        "StatusReason",
        "Why a task waits (input, timer, subtask), is blocked (restart_limit, "
        "missing_definition, incompatible_store, pinned, lost_commits) or failed "
        "(deadline, guardrail, output_invalid).",
    ),
]


class Problem(BaseModel):
    """An error, as RFC 9457 problem details."""

    type: str = Field(
        "about:blank",
        description="The kind of error: `/problems/<slug>`, stable (docs/http-api.md lists "
        "each); compare it, not the title.",
    )
    title: str
    status: int
    detail: str | None = None
    errors: list[dict[str, Any]] | None = None


# --- requests ----------------------------------------------------------------


_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def iso_time_only(value: Any) -> Any:
    """A time in a request is ISO 8601 text (or null), never a number of seconds."""
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, str) or _NUMBER.fullmatch(value):
        raise ValueError("a time is ISO 8601 text with a zone, e.g. 2030-01-01T09:00:00Z")
    return value


IsoTime = Annotated[datetime, BeforeValidator(iso_time_only)]


_TIME: TypeAdapter[datetime] = TypeAdapter(datetime)


def time_or_seconds(value: Any) -> Any:
    """A deadline is ISO 8601 text (a time) or a JSON number (seconds from now), never
    a number read as a time nor text read as a number."""
    if isinstance(value, bool):
        raise ValueError("a deadline is ISO 8601 text with a zone, or a number of seconds")
    if isinstance(value, str):
        return _TIME.validate_python(iso_time_only(value))
    return value


def in_utc(value: Any) -> Any:
    if isinstance(value, datetime):
        try:
            return value.astimezone(UTC)
        except (OverflowError, ValueError):
            raise ValueError("the time is past any calendar once in UTC") from None
    return value


DEADLINE_SECONDS = 10 * 365 * 86400
Deadline = Annotated[
    AwareDatetime | Annotated[float, Field(gt=0, le=DEADLINE_SECONDS)],
    BeforeValidator(time_or_seconds),
    AfterValidator(in_utc),
    Field(
        description="A wall-clock limit: a time (ISO 8601, with a zone) or seconds from now. "
        "Past it the task stops at its next safe point, failed with status_reason 'deadline'.",
    ),
]


class _Request(BaseModel):
    # Strict: "0" is not a boolean; a request means exactly what its JSON says.
    model_config = ConfigDict(extra="forbid", strict=True)


class TaskCreate(_Request):
    # continue_session needs a session: said in the schema and checked on input.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {
                "properties": {"continue_session": {"const": True}},
                "required": ["continue_session"],
            },
            "then": {"required": ["session_id"], "properties": {"session_id": {"type": "string"}}},
        },
    )

    agent: str = Field(min_length=1, max_length=200, description="Name of the agent to run.")
    input: Any = Field(description="The task's input: text, or any JSON value.")
    request_id: str | None = Field(
        None, max_length=200, description="Idempotency key: the same id returns the same task."
    )
    context: dict[str, Any] | None = None
    session_id: str | None = Field(None, max_length=200)
    continue_session: bool = Field(
        False,
        description="Start from the conversation of the session's latest finished task; "
        "while a task of the session is pending, running or waiting, the input is sent "
        "into it instead (202), as multitask_strategy says.",
    )
    multitask_strategy: Strategy | None = Field(
        None,
        description="What a new message does while a turn of this session runs "
        "(default: the agent's): enqueue, reject, interrupt or rollback.",
    )
    queue: str | None = Field(
        None, min_length=1, max_length=200, description="Queue to wait in (default: the agent's)."
    )
    # Not strict: JSON Schema calls 3.0 an integer. Text and booleans are still refused.
    priority: int = Field(
        0, ge=-1000, le=1000, strict=False, description="Higher is claimed first."
    )

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_is_a_number(cls, value: Any) -> Any:
        if isinstance(value, str | bool):
            raise ValueError("priority is a number")
        return value

    metadata: dict[str, str | int | float | bool] | None = Field(
        None, max_length=32, description="Labels to filter by (GET /v1/tasks?meta=key:value)."
    )
    start_at: datetime | None = Field(
        None, strict=False, description="Hold the task until then (ISO 8601, with a zone)."
    )

    _times_are_text = field_validator("start_at", mode="before")(iso_time_only)
    deadline: Deadline | None = None

    @model_validator(mode="after")
    def _session_to_continue(self) -> TaskCreate:
        if self.continue_session and self.session_id is None:
            raise ValueError("continue_session=true needs a session_id")
        return self


class PauseRequest(_Request):
    rollback: bool = Field(False, description="Void the incomplete round's API entries.")


class RetryRequest(_Request):
    deadline: Deadline | None = Field(
        None, description="A new deadline; without one, a deadline that has passed is dropped."
    )


class PlanRequest(_Request):
    steps: list[Annotated[str, StringConstraints(min_length=1, max_length=2000)]] = Field(
        max_length=200,
        description="The task's pending steps, in order (an empty list clears the plan).",
    )


class AbortRequest(_Request):
    reason: str | None = Field(None, max_length=2000)


class RespondRequest(_Request):
    approve: bool | None = Field(None, description="For an approval: allow or deny the call.")
    reason: str | None = Field(None, max_length=2000)
    answer: str | None = Field(None, max_length=100_000, description="For a question.")
    call_id: str | None = Field(None, max_length=200, description="Which open wait to answer.")
    arguments: dict[str, Any] | None = Field(
        None,
        description="With approve=true: run the call with these arguments instead of the "
        "model's (checked against the tool's schema: 422 if they don't fit; the model is "
        "told they were edited).",
    )
    decisions: dict[Annotated[str, StringConstraints(max_length=200)], Decision] | None = Field(
        None,
        max_length=100,
        description="Decide several open approvals at once, by call id (one commit; "
        "nothing is written if any of them is refused). Alone, without the other fields.",
    )


# --- responses ---------------------------------------------------------------


class OpenWait(BaseModel):
    call_id: str
    wait: WaitKindName
    question: str | None = None
    child_id: str | None = None
    wake_at: datetime | None = None
    tool: str | None = Field(None, description="An approval's tool.")
    arguments: dict[str, Any] | None = Field(None, description="An approval's arguments.")
    expires_at: datetime | None = Field(
        None, description="When an undecided approval is denied (approval_timeout)."
    )
    editable: bool = Field(
        True,
        description="An approval whose arguments a person may edit; false for one asked "
        "from inside a tool's run (a Pydantic AI tool), decided as it is.",
    )


class WaitingOn(BaseModel):
    """What a waiting task waits for, in short (the full wait: TaskOut.waiting_for)."""

    wait: WaitKindName
    tool: str | None = Field(None, description="An approval's tool.")


class TaskSummary(BaseModel):
    id: str
    agent: str
    status: TaskStatus
    status_reason: StatusReasonName | None
    session_id: str | None
    parent_id: str | None
    iterations: int
    current_step: int | None = Field(
        description="The round being worked on (iterations + 1) while the task is active."
    )
    error: str | None
    created_at: datetime
    updated_at: datetime
    queue: str
    priority: int
    metadata: dict[str, Any]
    waiting_on: list[WaitingOn] = Field(
        default_factory=list,
        description="While waiting: each open wait's kind (an approval names its tool), "
        "e.g. to tell an approval from a question, both status_reason 'input'.",
    )
    agent_version: str | None = Field(
        default=None,
        description="The version of its agent the task runs on; null: any (a task from "
        "before versions). Moved only by POST /v1/tasks/{task_id}/migrate.",
    )
    unserved: str | None = Field(
        default=None,
        description="While pending: why no worker will start it, when no live worker "
        "serves its version, e.g. 'waiting for assistant@v3: no worker serves it'.",
    )

    @classmethod
    def of(
        cls, task: Task, waiting_on: list[WaitingOn] | None = None, unserved: str | None = None
    ) -> TaskSummary:
        return cls(**_summary_fields(task), waiting_on=waiting_on or [], unserved=unserved)


class TaskOut(TaskSummary):
    root_id: str | None
    request_id: str | None
    input: Any
    output: Any
    context: dict[str, Any]
    usage: Usage
    restarts: int
    last_seq: int = Field(description="Seq of the last committed entry (resume events after it).")
    paused_at: datetime | None
    completed_at: datetime | None
    wake_at: datetime | None
    deadline: datetime | None = Field(
        description="The wall-clock limit the task fails at (status_reason 'deadline')."
    )
    lease_expires_at: datetime | None = Field(
        default=None,
        description="While running: until when its worker holds the task. A live worker "
        "renews the lease well before then; if that worker died, no other may take the "
        "task over before this time.",
    )
    lease_worker_seen_at: datetime | None = Field(
        default=None,
        description="While running: when the worker holding the lease last recorded itself "
        "alive (it does every few seconds); null if its record does not say.",
    )
    lease_worker_gone_after: datetime | None = Field(
        default=None,
        description="While running: past this time without a new sign of life, that worker "
        "has missed two check-ins and is presumably gone; the task is taken over when its "
        "lease ends (lease_expires_at).",
    )
    waiting_for: list[OpenWait] = Field(
        default_factory=list, description="Open approvals, questions, timers and sub-tasks."
    )
    forked_from: dict[str, str | int] | None = Field(
        default=None, description="A fork's source: its task_id and round."
    )
    partial_output: str | None = Field(
        default=None,
        description="While running: the answer the model has streamed so far in the "
        "current round, as committed (progress entries).",
    )

    @classmethod
    def full(
        cls,
        task: Task,
        waits: list[OpenWait] | None = None,
        holder: Sighting | None = None,
        unserved: str | None = None,
    ) -> TaskOut:
        waits = waits or []
        return cls(
            **_summary_fields(task),
            unserved=unserved,
            waiting_on=[WaitingOn(wait=w.wait, tool=w.tool) for w in waits],
            root_id=task.root_id,
            request_id=task.request_id,
            input=task.input,
            output=task.output,
            context=task.context,
            usage=task.usage,
            restarts=task.restarts,
            last_seq=task.last_seq,
            paused_at=task.paused_at,
            completed_at=task.completed_at,
            wake_at=task.wake_at,
            deadline=task.deadline,
            lease_expires_at=task.lease.expires_at if task.status is TaskStatus.RUNNING else None,
            lease_worker_seen_at=holder.seen_at if holder else None,
            lease_worker_gone_after=holder.gone_after if holder else None,
            waiting_for=waits,
            forked_from=task.config.get("forked_from"),
            partial_output=task.partial_output,
        )


ACTIVE_STATUSES = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING, TaskStatus.PAUSED)


def _summary_fields(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "agent": task.agent,
        "status": task.status,
        "status_reason": task.status_reason,
        "session_id": task.session_id,
        "parent_id": task.parent_id,
        "iterations": task.iterations,
        "current_step": task.iterations + 1 if task.status in ACTIVE_STATUSES else None,
        "error": task.error,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "queue": task.queue or task.agent,
        "priority": task.priority,
        "metadata": task.metadata,
        "agent_version": task.agent_version,
    }


class TaskPageOut(BaseModel):
    tasks: list[TaskSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class MessagesOut(BaseModel):
    view: Literal["model", "ui"]
    messages: list[ApiMessage] | list[UIMessage]


class EntriesOut(BaseModel):
    entries: list[Entry]
    last_seq: int = Field(description="The task's last committed seq when these were read.")


class ActionOut(BaseModel):
    tool: str
    arguments: dict[str, Any]
    observation: str | None
    outcome: str | None


class StepOut(BaseModel):
    round: int
    thought: str | None
    actions: list[ActionOut]


class StepsOut(BaseModel):
    completed: list[StepOut]
    pending: list[str]
    output: Any
    iterations: int

    @classmethod
    def of(cls, steps: Steps) -> StepsOut:
        return cls(
            completed=[
                StepOut(
                    round=s.round,
                    thought=s.thought,
                    actions=[ActionOut(**a) for a in s.actions],
                )
                for s in steps.completed
            ],
            pending=steps.pending,
            output=steps.output,
            iterations=steps.iterations,
        )


class TreeOut(BaseModel):
    task: TaskSummary
    children: list[TreeOut]

    @classmethod
    def of(cls, tree: TaskTree) -> TreeOut:
        return cls(task=TaskSummary.of(tree.task), children=[cls.of(c) for c in tree.children])


class ToolOut(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any] = Field(description="JSON schema of the arguments.")
    replay: Literal["never", "safe", "resume"]
    approval: Literal["always", "never", "conditional"] = Field(
        description="Whether a call waits for a person's approval: always, never, or "
        "conditional (the tool's rule decides per call)."
    )
    requires_approval: Annotated[
        bool | Literal["conditional"],
        WithJsonSchema(
            {
                "anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["conditional"]}],
                "deprecated": True,
                "description": "The same as `approval`, as true, false or 'conditional' "
                "(kept for older clients).",
            }
        ),
    ]
    approval_timeout: float | None = Field(
        None, description="Seconds an approval stays open before the call is denied."
    )


class AgentOut(BaseModel):
    name: str
    model: str
    max_iterations: int
    tools: list[ToolOut]
    output_schema: dict[str, Any] | None = Field(
        None,
        description="The JSON schema a task's output meets (the agent's output_type), "
        "as its tasks pin it; null: the output is the model's text.",
    )

    @classmethod
    def of(cls, agent: Agent) -> AgentOut:
        tools = []
        for t in agent.tool_map.values():
            rule = t.requires_approval
            tools.append(
                ToolOut(
                    name=t.name,
                    description=t.description,
                    parameters=t.parameters,
                    replay=t.replay,
                    approval="conditional" if callable(rule) else "always" if rule else "never",
                    requires_approval="conditional" if callable(rule) else bool(rule),
                    approval_timeout=t.approval_timeout,
                )
            )
        return cls(
            name=agent.name,
            model=agent.model_name,
            max_iterations=agent.limits.max_iterations,
            tools=tools,
            output_schema=None if agent.output_pin is None else agent.output_pin["schema"],
        )


class AgentsOut(BaseModel):
    agents: list[AgentOut]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    store: str
    worker: bool


class Me(BaseModel):
    user: str
    admin: bool = Field(
        description="Whether this user may change what every user shares (queue limits): "
        "duragent serve --admin USER."
    )


# --- sessions (server/_sessions.py) ------------------------------------------------


class SessionOut(BaseModel):
    session_id: str
    turns: int = Field(description="Its top-level tasks (sub-tasks are not turns).")
    started_at: datetime
    updated_at: datetime
    latest_task_id: str
    latest_status: TaskStatus

    @classmethod
    def of(cls, s: SessionSummary) -> SessionOut:
        return cls(
            session_id=s.session_id,
            turns=s.turns,
            started_at=s.started_at,
            updated_at=s.updated_at,
            latest_task_id=s.latest_task_id,
            latest_status=s.latest_status,
        )


class SessionPageOut(BaseModel):
    sessions: list[SessionOut]


class SessionDetailOut(BaseModel):
    session_id: str
    tasks: list[TaskSummary] = Field(description="Its turns, oldest first.")
    transcript: list[ApiMessage] = Field(
        description="What was said, turn after turn (each turn's own messages)."
    )


class SessionMessage(_Request):
    input: Any = Field(description="The next turn's input: text, or any JSON value.")
    agent: str | None = Field(
        None, min_length=1, max_length=200, description="Default: the latest turn's agent."
    )
    request_id: str | None = Field(None, min_length=1, max_length=200)
    multitask_strategy: Strategy | None = Field(
        None, description="While a turn runs: what the message does to it."
    )


# --- event streams, stream tokens and waits ---------------------------------------


class StreamEnd(BaseModel):
    """The data of a stream's last event (`event: end`)."""

    kind: Literal["end"] = Field("end", description="Tells it from an entry's `kind`.")
    status: TaskStatus | None = Field(
        description="The task's final status (null: the task was deleted while watched)."
    )
    last_seq: int = Field(description="The seq of the last entry sent.")


class StreamTokenOut(BaseModel):
    token: str = Field(
        description="Pass as ?stream_token= to this task's /events (only): for a browser's "
        "EventSource, which cannot send an Authorization header."
    )
    expires_at: datetime = Field(
        description="Opening a stream is refused after this; a stream opened before goes on."
    )
    events_url: str = Field(description="The task's event stream with the token, a path.")


class TaskWaitOut(TaskOut):
    """A task as /wait left it."""

    timed_out: bool = Field(
        description="True: the timeout came first (the task is as it is now, not yet what "
        "`until` asked for); false: it is."
    )
