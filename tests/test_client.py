"""duragent.client against a live `duragent serve`: submit, stream (through a
connection cut mid-stream), wait, approvals with edited arguments, messages with
request ids, fork, retry, lists, and problems raised as duragent's own errors.
One server for the module; each test makes its own tasks."""

from __future__ import annotations

import pickle
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from duragent import errors
from duragent.client import (
    AsyncClient,
    BulkOut,
    BulkPageOut,
    Client,
    ClientError,
    StreamEnd,
    TaskNotFound,
    TaskOut,
    TaskPageOut,
    TaskStreamEvent,
    TaskSummary,
    TaskWaitOut,
    TooManyRequests,
)
from duragent.client._errors import BY_TYPE, api_error
from duragent.client._sse import SseDecoder
from duragent.server import TokenStore, create_app
from duragent.server._problem_types import PREFIX, PROBLEM_TYPES
from duragent.types import Entry
from support.pgproxy import forwarder
from support.readme import first_block_under, run
from support.server_live import TOKENS, LiveServer, child_env, live_server


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gates: Path) -> Iterator[LiveServer]:
    env = child_env(DURAGENT_TEST_GATES=str(gates))
    with live_server(tmp_path_factory.mktemp("serve"), workers=2, env=env) as live:
        yield live


def client(server: LiveServer, user: str = "alice", url: str | None = None) -> AsyncClient:
    return AsyncClient(url or server.url, TOKENS[user])


def gate() -> str:
    return f"gate-{uuid.uuid4().hex[:8]}"


# --- the models and errors match the server -----------------------------------------


def test_the_clients_models_have_the_fields_of_the_servers_document() -> None:
    from duragent import Runtime
    from server_agents import agents

    doc = create_app(Runtime("memory://", agents()), TokenStore.from_mapping({})).openapi()
    schemas = doc["components"]["schemas"]
    for model in (TaskOut, TaskSummary, TaskPageOut, TaskWaitOut, StreamEnd, BulkOut, BulkPageOut):
        server = schemas[model.__name__]
        assert set(model.model_fields) == set(server["properties"]), model.__name__
        required = {n for n, f in model.model_fields.items() if f.is_required()}
        assert required <= set(server.get("required", [])), model.__name__


def test_every_problem_type_has_an_error_class_of_its_status_family() -> None:
    assert set(BY_TYPE) == {PREFIX + slug for slug in PROBLEM_TYPES}
    assert issubclass(BY_TYPE["/problems/task-not-found"], errors.TaskNotFound)
    assert issubclass(BY_TYPE["/problems/task-finished"], errors.InvalidTransition)
    assert issubclass(BY_TYPE["/problems/store-unavailable"], errors.StoreUnavailable)
    for slug, (status, _, _) in PROBLEM_TYPES.items():
        if status == 404:
            assert issubclass(BY_TYPE[PREFIX + slug], errors.NotFound), slug


# --- the flows ---------------------------------------------------------------------


@pytest.mark.slow  # a live server
async def test_a_stream_cut_mid_task_reconnects_and_loses_or_repeats_no_event(
    server: LiveServer, gates: Path
) -> None:
    """The connection goes through a proxy that is cut after the first event, while
    the task waits at a gate: the rest (the gate's result, the answer, the end) can
    only come on a new connection, resumed by Last-Event-ID."""
    name = gate()
    with forwarder(*server.host_port) as proxy:
        async with client(server, url=f"http://127.0.0.1:{proxy.port}") as c:
            task = await c.submit("holder", name)
            events: list[TaskStreamEvent] = []
            async for event in c.stream(task.id):
                events.append(event)
                if len(events) == 1:
                    before = proxy.accepted
                    proxy.cut()  # closes the stream's connection
                    proxy.restore()  # and lets the reconnect through
                    (gates / name).touch()
            done = await c.get(task.id)
    assert proxy.accepted > before  # the stream was opened again
    end = events[-1]
    assert isinstance(end, StreamEnd) and end.status == "completed"
    entries = [e for e in events if isinstance(e, Entry)]
    assert [e.seq for e in entries] == list(range(1, done.last_seq + 1))
    assert end.last_seq == done.last_seq
    assert any("gate" in str(e.payload) and "opened" in str(e.payload) for e in entries)


@pytest.mark.slow  # a live server
async def test_wait_returns_the_finished_task_or_times_out(server: LiveServer, gates: Path) -> None:
    async with client(server) as c:
        quick = await c.submit("quick", "hi")
        done = await c.wait(quick.id)
        assert (done.status, done.output, done.timed_out) == (
            "completed",
            "Hello from quick.",
            False,
        )
        name = gate()
        held = await c.submit("holder", name)
        late = await c.wait(held.id, timeout=0.3)
        assert late.timed_out and not late.status.terminal
        (gates / name).touch()
        assert (await c.wait(held.id, timeout=60)).status == "completed"


@pytest.mark.slow  # a live server
async def test_an_approval_is_granted_with_edited_arguments(server: LiveServer) -> None:
    async with client(server) as c:
        task = await c.submit("approver", "mail bob")
        parked = await c.wait(task.id, until="input", timeout=60)
        assert not parked.timed_out and parked.status == "waiting"
        [open_wait] = parked.waiting_for
        assert (open_wait.wait, open_wait.tool) == ("approval", "send_email")
        with pytest.raises(errors.InvalidArguments) as bad:
            await c.respond(task.id, approve=True, arguments={"to": 42})
        assert bad.value.status == 422  # type: ignore[attr-defined]
        await c.respond(
            task.id, approve=True, arguments={"to": "carol@example.com", "body": "edited"}
        )
        done = await c.wait(task.id, timeout=60)
        assert (done.status, done.output) == ("completed", "Email done.")
        results = [str(e.payload) async for e in c.stream(task.id) if isinstance(e, Entry)]
    assert any("sent to carol@example.com" in r for r in results)


@pytest.mark.slow  # a live server
async def test_a_message_with_a_request_id_is_sent_once(server: LiveServer, gates: Path) -> None:
    name = gate()
    async with client(server) as c:
        task = await c.submit("holder", name)
        await c.send(task.id, "also this", request_id="m-1")
        await c.send(task.id, "also this", request_id="m-1")  # a retry: nothing new
        with pytest.raises(errors.DuplicateRequest):
            await c.send(task.id, "something else", request_id="m-1")
        (gates / name).touch()
        assert (await c.wait(task.id, timeout=60)).status == "completed"
        payloads = [str(e.payload) async for e in c.stream(task.id) if isinstance(e, Entry)]
        with pytest.raises(errors.InvalidTransition) as finished:
            await c.send(task.id, "too late")
    assert sum("also this" in p for p in payloads if "'role': 'user'" in p) == 1
    assert finished.value.type == "/problems/task-finished"  # type: ignore[attr-defined]


@pytest.mark.slow  # a live server
async def test_another_users_task_is_not_found(server: LiveServer) -> None:
    async with client(server) as alice, client(server, "bob") as bob:
        task = await alice.submit("quick", "mine")
        for call in (bob.get(task.id), bob.wait(task.id, timeout=1), bob.retry(task.id)):
            with pytest.raises(TaskNotFound) as missing:
                await call
            error = missing.value
            assert isinstance(error, errors.TaskNotFound) and isinstance(error, errors.NotFound)
            assert (error.status, error.type) == (404, "/problems/task-not-found")
            assert error.detail and task.id in str(error)
        with pytest.raises(errors.NotFound):
            async for _ in bob.stream(task.id):
                pass


@pytest.mark.slow  # a live server
async def test_fork_and_retry(server: LiveServer) -> None:
    async with client(server) as c:
        first = await c.submit("quick", "to fork")
        await c.wait(first.id, timeout=60)
        fork = await c.fork(first.id, 1, request_id="fork-1")
        assert fork.id != first.id and fork.forked_from == {"task_id": first.id, "round": 1}
        assert (await c.fork(first.id, 1, request_id="fork-1")).id == fork.id
        assert (await c.wait(fork.id, timeout=60)).status == "completed"

        later = await c.submit("quick", "later", start_at=datetime.now(UTC) + timedelta(hours=1))
        moved = await c.migrate(later.id, "v7")
        assert moved.agent_version == "v7" and later.agent_version not in (None, "v7")
        assert moved.unserved == "waiting for quick@v7: no worker serves it"

        flaky = await c.submit("flaky", f"fail {uuid.uuid4().hex}")
        assert (await c.wait(flaky.id, timeout=60)).status == "failed"
        await c.retry(flaky.id)
        again = await c.wait(flaky.id, timeout=60)
        assert (again.status, again.output) == ("completed", "Done after a retry.")


@pytest.mark.slow  # a live server
async def test_a_stream_left_early_closes_its_connection(server: LiveServer) -> None:
    async with client(server) as c:
        task = await c.submit("slow", "tick")
        stream = c.stream(task.id)
        async for _ in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]
        # The stream's response is closed: its connection is idle in the pool, or gone.
        pool = c._http._transport._pool  # type: ignore[attr-defined]
        assert all(conn.is_idle() for conn in pool.connections)
        await c.abort(task.id)


@pytest.mark.slow  # a live server
async def test_pause_resume_and_abort(server: LiveServer) -> None:
    async with client(server) as c:
        task = await c.submit("slow", "tick")
        await c.pause(task.id)
        paused = await c.wait(task.id, until="input", timeout=60)
        assert (paused.status, paused.timed_out) == ("paused", False)
        assert (await c.resume(task.id)).status in {"pending", "running"}
        await c.abort(task.id, reason="enough")
        assert (await c.wait(task.id, timeout=60)).status == "aborted"
        with pytest.raises(errors.InvalidTransition) as done:
            await c.resume(task.id)
    assert done.value.type == "/problems/invalid-transition"  # type: ignore[attr-defined]


@pytest.mark.slow  # a live server
async def test_lists_filter_and_page(server: LiveServer) -> None:
    batch = uuid.uuid4().hex
    async with client(server) as c:
        made = [(await c.submit("quick", f"n{i}", metadata={"batch": batch})).id for i in range(3)]
        first = await c.list(metadata={"batch": batch}, limit=2)
        assert len(first.tasks) == 2 and first.next_cursor
        second = await c.list(metadata={"batch": batch}, limit=2, cursor=first.next_cursor)
        assert second.next_cursor is None
        seen = [t.id for t in first.tasks + second.tasks]
        assert sorted(seen) == sorted(made)
        assert sorted([t.id async for t in c.tasks(metadata={"batch": batch}, limit=1)]) == sorted(
            made
        )
        assert (await c.list(metadata={"batch": batch}, agent="slow")).tasks == []
        assert [t.id for t in (await c.list(id_prefix=made[1])).tasks] == [made[1]]


@pytest.mark.slow  # a live server
def test_the_blocking_client_runs_the_same_calls(server: LiveServer) -> None:
    with Client(server.url, TOKENS["alice"]) as c:
        task = c.submit("streamer", "go")
        kinds = [e.kind for e in c.stream(task.id)]
        assert kinds[-1] == "end" and "progress" in kinds
        assert c.wait(task.id).status == "completed"
        assert c.get(task.id).id == task.id
        with pytest.raises(errors.TaskNotFound):
            c.get("no-such-task")
    with Client(server.url, "wrong-token") as c, pytest.raises(errors.UsageError) as refused:
        c.get(task.id)
    assert getattr(refused.value, "status", None) == 401


@pytest.mark.slow  # a live server
def test_the_readme_example_runs_against_a_live_server(server: LiveServer, tmp_path: Path) -> None:
    code = first_block_under("From your app")
    code = code.replace("http://127.0.0.1:8000", server.url).replace("YOUR-TOKEN", TOKENS["alice"])
    code = code.replace('"assistant"', '"quick"')
    done = run(code, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed" in done.stdout


# --- without a server ----------------------------------------------------------------


def test_the_client_imports_neither_fastapi_nor_the_server() -> None:
    code = (
        "import sys, duragent.client; "
        "print([m for m in sys.modules if m.split('.')[0] in ('fastapi', 'uvicorn') "
        "or m.startswith('duragent.server')])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_sse_lines_decode_into_events_and_comments_are_skipped() -> None:
    decoder = SseDecoder()
    lines = [": keep-alive", "", "retry: 1000", "", "id: 7", "event: progress"]
    lines += ['data: {"a":', "data: 1}", "", "event: end", "data: {}", ""]
    events = [e for line in lines if (e := decoder.feed(line)) is not None]
    assert [(e.event, e.data, e.id) for e in events] == [
        ("progress", '{"a":\n1}', "7"),
        ("end", "{}", None),
    ]
    assert decoder.retry_ms == 1000


def test_a_problem_error_pickles_and_an_unknown_type_falls_back_on_its_status() -> None:
    error = api_error(404, {"type": "/problems/task-not-found", "detail": "no task 'x'"}, {})
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is TaskNotFound and str(copy) == str(error)
    assert (copy.status, copy.type, copy.detail) == (404, "/problems/task-not-found", "no task 'x'")
    newer = api_error(409, {"type": "/problems/something-new", "title": "New"}, {})
    assert isinstance(newer, errors.Conflict) and newer.type == "/problems/something-new"
    plain = api_error(503, "Service Unavailable", {})  # uvicorn's plain-text answer
    assert isinstance(plain, errors.StoreUnavailable) and "Service Unavailable" in str(plain)
    slow = api_error(429, {"type": "/problems/too-many-requests"}, {"retry-after": "3"})
    assert isinstance(slow, TooManyRequests) and slow.retry_after == 3.0


async def test_the_blocking_client_refuses_to_block_a_running_loop() -> None:
    with pytest.raises(errors.UsageError, match="AsyncClient"), Client("http://127.0.0.1:9") as c:
        c.get("t-1")


async def test_an_answer_that_is_not_the_apis_is_a_client_error() -> None:
    def not_duragent(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>a captive portal</html>")

    http = httpx.AsyncClient(base_url="http://x", transport=httpx.MockTransport(not_duragent))
    async with AsyncClient(http=http) as c, http:
        with pytest.raises(ClientError, match="is not a TaskOut"):
            await c.get("t-1")
