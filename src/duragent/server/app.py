"""The HTTP service: `create_app(runtime, tokens)` -> a FastAPI app.

The caller owns the runtime (opens and closes it); the app only starts its
scheduler at startup when the runtime runs an in-process worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from duragent.runtime.runtime import Runtime
from duragent.server import events, problems, steering, tasks
from duragent.server.auth import TokenStore
from duragent.server.deps import RuntimeDep, UserDep, known_query
from duragent.server.problems import problem_responses
from duragent.server.schemas import AgentOut, AgentsOut, Health, Me

STATIC = Path(__file__).parent / "static"


def create_app(runtime: Runtime, tokens: TokenStore) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime.run_worker:
            await runtime.resume()  # start the scheduler: pick up pending and orphaned tasks
        yield

    from duragent import __version__

    app = FastAPI(
        dependencies=[Depends(known_query)],
        title="duragent",
        version=__version__,
        description="Durable AI agent tasks: start, watch, pause, resume, abort, answer.",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.tokens = tokens
    problems.install(app, list(runtime.agents))
    app.include_router(tasks.router)
    app.include_router(events.router)
    app.include_router(steering.router)

    @app.get("/v1/health", response_model=Health, tags=["service"], summary="Liveness (no auth)")
    async def health(rt: RuntimeDep) -> Health:
        return Health(store=rt.store.url.split("://", 1)[0], worker=rt.run_worker)

    @app.get(
        "/v1/me",
        response_model=Me,
        tags=["service"],
        summary="Who the token belongs to",
        responses=problem_responses(401),
    )
    async def me(user: UserDep) -> Me:
        return Me(user=user)

    @app.get(
        "/v1/agents",
        response_model=AgentsOut,
        tags=["service"],
        summary="Agents, their tools and replay policies",
        responses=problem_responses(401),
    )
    async def agents(user: UserDep, rt: RuntimeDep) -> AgentsOut:
        return AgentsOut(agents=[AgentOut.of(a) for _, a in sorted(rt.agents.items())])

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
