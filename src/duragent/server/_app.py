"""The HTTP service: `create_app(runtime, tokens, limits)` -> a FastAPI app.

The caller owns the runtime (opens and closes it); the app only starts its
scheduler at startup when the runtime runs an in-process worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from duragent.runtime._runtime import Runtime
from duragent.server import (
    _bulk as bulk,
    _events as events,
    _fleet as fleet,
    _problems as problems,
    _sessions as sessions,
    _steering as steering,
    _tasks as tasks,
    _wait as wait,
)
from duragent.server._deps import RuntimeDep, UserDep, is_admin, known_query
from duragent.server._gate import Gate, TokenLookup
from duragent.server._limits import ServerLimits
from duragent.server._openapi import complete_openapi, operation_id
from duragent.server._problems import problem_responses
from duragent.server._schemas import AgentOut, AgentsOut, Health, Me
from duragent.server._stream_tokens import StreamTokens, hide_tokens_in_access_log
from duragent.server._streams import StreamSlots, TooManyStreams, too_many_streams

STATIC = Path(__file__).parent / "static"


# The service's own routes: who is asking, what runs here, the page.
service = APIRouter()


@service.get("/v1/health", response_model=Health, tags=["service"], summary="Liveness (no auth)")
async def get_health(rt: RuntimeDep) -> Health:
    return Health(store=rt.store.url.split("://", 1)[0], worker=rt.run_worker)


@service.get(
    "/v1/me",
    response_model=Me,
    tags=["service"],
    summary="Who the token belongs to",
    responses=problem_responses(401),
)
async def get_me(user: UserDep, request: Request) -> Me:
    return Me(user=user, admin=is_admin(request, user))


@service.get(
    "/v1/agents",
    response_model=AgentsOut,
    tags=["service"],
    summary="Agents, their tools and replay policies",
    responses=problem_responses(401),
)
async def list_agents(user: UserDep, rt: RuntimeDep) -> AgentsOut:
    return AgentsOut(agents=[AgentOut.of(a) for _, a in sorted(rt.agents.items())])


# The same document with a token or without: agent names are not in it (GET /v1/agents).
@service.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@service.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


# Browsers ask for /favicon.ico whatever the page says; the page names the SVG.
@service.get("/favicon.ico", include_in_schema=False)
@service.get("/favicon.svg", include_in_schema=False)
async def favicon() -> FileResponse:
    return FileResponse(
        STATIC / "favicon.svg",
        media_type="image/svg+xml",
        headers={"Cache-Control": "public, max-age=86400"},
    )


def create_app(
    runtime: Runtime,
    tokens: TokenLookup,
    limits: ServerLimits | None = None,
    *,
    admins: Iterable[str] = (),
    stream_tokens: StreamTokens | None = None,
) -> FastAPI:
    """The app; `tokens` is a TokenStore or a WatchedTokenFile, `limits` what one
    client may ask (ServerLimits() by default). `admins`: the users who may change
    what every user shares (queue limits); with none, nobody may over HTTP.
    `stream_tokens`: what signs stream tokens (default: $DURAGENT_STREAM_SECRET, else
    a secret made for this process)."""
    limits = limits or ServerLimits()

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
        # No /docs or /redoc: they load scripts from a CDN on the origin the token
        # lives on. /openapi.json is served by `service`.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        generate_unique_id_function=operation_id,
    )
    app.state.runtime = runtime
    app.state.tokens = tokens
    app.state.limits = limits
    app.state.admins = frozenset(admins)
    app.state.streams = StreamSlots(limits.streams_per_user)
    app.state.stream_tokens = stream_tokens or StreamTokens()
    hide_tokens_in_access_log()
    app.state.task_watch = wait.TaskWatch(runtime.store)
    problems.install(app)
    complete_openapi(app)
    app.add_exception_handler(TooManyStreams, too_many_streams)
    app.add_middleware(Gate, tokens=tokens, limits=limits, stream_tokens=app.state.stream_tokens)
    routers = (tasks.router, wait.router, events.router, steering.router, fleet.router)
    for router in (*routers, sessions.router, bulk.router):
        app.include_router(router)
    app.include_router(service)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
