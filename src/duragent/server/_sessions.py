"""REST routes for sessions under /v1/sessions: the caller's own conversations.

A session is the caller's tasks under one session_id (runtime/_sessions.py);
another user's session is 404, exactly like one that does not exist.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from duragent.server._deps import RuntimeDep, UserDep
from duragent.server._limits import check_task_sizes
from duragent.server._problems import problem_responses
from duragent.server._schemas import (
    SessionDetailOut,
    SessionMessage,
    SessionOut,
    SessionPageOut,
    TaskOut,
    TaskSummary,
)
from duragent.server._strict_json import StrictJsonRoute
from duragent.server._tasks import submission_out

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], route_class=StrictJsonRoute)

SessionId = Annotated[str, Path(min_length=1, max_length=200, description="A session id.")]


@router.get(
    "", response_model=SessionPageOut, summary="List my sessions", responses=problem_responses(401)
)
async def list_sessions(user: UserDep, runtime: RuntimeDep) -> SessionPageOut:
    found = await runtime.sessions(owner=user)
    return SessionPageOut(sessions=[SessionOut.of(s) for s in found])


@router.get(
    "/{session_id}",
    response_model=SessionDetailOut,
    summary="A session's turns and transcript",
    responses=problem_responses(401, 404, 422),
)
async def get_session(
    session_id: SessionId, user: UserDep, runtime: RuntimeDep
) -> SessionDetailOut:
    s = await runtime.session(session_id, owner=user)
    return SessionDetailOut(
        session_id=s.session_id,
        tasks=[TaskSummary.of(t) for t in s.tasks],
        transcript=s.transcript,
    )


@router.post(
    "/{session_id}/messages",
    status_code=201,
    response_model=TaskOut,
    summary="Continue a session",
    description="The next turn: a new task starting from the conversation so far (201); "
    "while a turn runs, the input is sent into it as a message (202).",
    responses={
        200: {"model": TaskOut, "description": "A turn with this request_id already exists"},
        202: {"model": TaskOut, "description": "Sent into the turn that runs (this one)"},
        **problem_responses(400, 401, 404, 409, 413, 422),
    },
)
async def continue_session(
    session_id: SessionId,
    body: SessionMessage,
    user: UserDep,
    runtime: RuntimeDep,
    response: Response,
    request: Request,
) -> TaskOut:
    check_task_sizes(body.input, None, request.app.state.limits)
    sub = await runtime.continue_session(
        session_id,
        body.input,
        owner=user,
        agent=body.agent,
        request_id=body.request_id,
        multitask_strategy=body.multitask_strategy,
    )
    return await submission_out(runtime, sub, response)
