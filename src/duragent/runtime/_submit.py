"""Creating tasks: the row, its pinned model request, and its first message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from duragent._storable import check_storable
from duragent.otel import current_trace_context
from duragent.runtime._deadlines import DeadlineSpec, deadline_at, deadline_record
from duragent.runtime._hosted import HOSTED_LOOP
from duragent.runtime._log import api_entry
from duragent.runtime._pins import with_pins
from duragent.runtime._versions import pinned_version
from duragent.types import NewEntry, Task, UserMessage, utcnow

if TYPE_CHECKING:
    from duragent.runtime._agent import Agent


def input_text(value: Any) -> str:
    """The user message a task's input becomes."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    import json

    return json.dumps(value, ensure_ascii=False, default=str)


def new_task(
    agent: Agent,
    input: Any,
    *,
    owner: str | None = None,
    session_id: str | None = None,
    request_id: str | None = None,
    parent_id: str | None = None,
    root_id: str | None = None,
    context: dict[str, Any] | None = None,
    webhook: str | None = None,
    deadline: DeadlineSpec | None = None,
    deadline_by: str = "submit",
) -> tuple[Task, NewEntry]:
    """A pending task and the entry holding its user message.

    The task runs on the agent's version (runtime/_versions.py). The model
    request (model, settings and provider URL) and the reach of the
    tools are pinned on the task now (runtime/_pins.py), so every model call of
    the task, including a resend after a crash, asks the same way, at the same place.
    Input and context no store could give back (see duragent._storable) are refused
    here, before anything is written. The deadline is `deadline` (a time, or a
    delay from now) or, without one, the agent's default delay.
    """
    check_storable(input, "input")
    check_storable(context, "context")
    config = with_pins(
        agent, {"request": {"model": agent.model_name, "settings": dict(agent.model_settings)}}
    )
    trace = current_trace_context()  # so every run of the task joins the submitter's trace
    if trace:
        config["trace"] = trace
    if agent.hosted_loop is not None:
        config[HOSTED_LOOP] = agent.hosted_loop
    if webhook or agent.webhook:
        config["webhook"] = webhook or agent.webhook
    if deadline is None:
        deadline = agent.deadline
    if deadline is not None:
        now = utcnow()
        config["deadline"] = deadline_record(deadline_at(deadline, now), deadline_by, now)
    task = Task(
        agent=agent.name,
        input=input,
        owner=owner,
        session_id=session_id,
        request_id=request_id,
        parent_id=parent_id,
        root_id=root_id,
        context=dict(context or {}),
        config=config,
        agent_version=pinned_version(agent),
    )
    return task, api_entry(task.id, 1, UserMessage(content=input_text(input)))
