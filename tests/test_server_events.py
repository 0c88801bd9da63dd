"""Server-sent events over a real uvicorn server: resumption, cross-process, keep-alive."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from duragent import Runtime
from duragent.server._events import entry_events
from server_agents import agents
from support.server_live import LiveServer, duragent, live_server, stop


@dataclass
class Event:
    id: int | None
    event: str
    data: Any


async def sse(response: httpx.Response) -> AsyncIterator[Event | str]:
    """Events (and comment lines, as str) parsed from a streaming response."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield line
        elif line == "":
            if "data" in fields:
                yield Event(
                    int(fields["id"]) if "id" in fields else None,
                    fields.get("event", "message"),
                    json.loads(fields["data"]),
                )
            fields = {}
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


async def start(client: httpx.AsyncClient, server: LiveServer, agent: str) -> str:
    r = await client.post(
        f"{server.url}/v1/tasks", json={"agent": agent, "input": "go"}, headers=server.headers()
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def read_to_end(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], got: list[Event]
) -> Event:
    async with client.stream("GET", url, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for ev in sse(r):
            if isinstance(ev, Event):
                if ev.event == "end":
                    return ev
                got.append(ev)
    raise AssertionError("the stream closed without an end event")


@pytest.fixture
def server(tmp_path: Path) -> Any:
    with live_server(tmp_path, workers=2) as s:
        yield s


@pytest.mark.slow
async def test_reconnect_with_last_event_id_misses_and_repeats_nothing(server: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        tid = await start(client, server, "streamer")
        url = f"{server.url}/v1/tasks/{tid}/events"
        got: list[Event] = []
        # First connection: read some progress, then hang up mid-stream.
        async with client.stream("GET", url, headers=server.headers()) as r:
            async for ev in sse(r):
                if isinstance(ev, Event):
                    got.append(ev)
                    if sum(e.event == "progress" for e in got) >= 5:
                        break
        first = len(got)
        task = (await client.get(f"{server.url}/v1/tasks/{tid}", headers=server.headers())).json()
        assert task["status"] == "running", "the task must still be running at the disconnect"
        # Second connection resumes after the last seq seen.
        headers = {**server.headers(), "Last-Event-ID": str(got[-1].id)}
        end = await read_to_end(client, url, headers, got)
        assert len(got) > first
        seqs = [e.id for e in got]
        assert seqs == list(range(1, len(seqs) + 1)), "every seq exactly once, gap-free"
        assert end.data == {"kind": "end", "status": "completed", "last_seq": seqs[-1]}
        # The events are exactly the committed entries.
        stored = (
            await client.get(f"{server.url}/v1/tasks/{tid}/entries", headers=server.headers())
        ).json()
        assert stored["last_seq"] == seqs[-1]
        assert [e.data for e in got] == stored["entries"]
        assert [e.event for e in got] == [e["kind"] for e in stored["entries"]]
        text = "".join(
            e.data["payload"]["text"]
            for e in got
            if e.event == "progress" and "call_id" not in e.data["payload"]
        )
        assert "durable execution" in text


@pytest.mark.slow
async def test_after_query_and_finished_task(server: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        tid = await start(client, server, "quick")
        url = f"{server.url}/v1/tasks/{tid}/events"
        everything: list[Event] = []
        end = await read_to_end(client, url, server.headers(), everything)
        assert end.data["status"] == "completed"
        # A finished task's stream replays what is asked for and ends at once.
        tail: list[Event] = []
        await read_to_end(client, f"{url}?after=2", server.headers(), tail)
        assert [e.id for e in tail] == [e.id for e in everything][2:]
        # The header wins over ?after= (a browser reconnect keeps its first URL).
        header_wins: list[Event] = []
        headers = {**server.headers(), "Last-Event-ID": str(everything[-1].id)}
        await read_to_end(client, f"{url}?after=0", headers, header_wins)
        assert header_wins == []
        r = await client.get(url, headers={**server.headers(), "Last-Event-ID": "x"})
        assert r.status_code == 400 and r.json()["title"] == "Bad request"
        r = await client.get(url, headers=server.headers("bob"))
        assert r.status_code == 404


@pytest.mark.slow
async def test_events_from_a_worker_in_another_process(tmp_path: Path) -> None:
    # API only: the task runs in a separate `duragent worker` writing to the same file.
    with live_server(tmp_path, workers=0) as server:
        async with httpx.AsyncClient(timeout=30) as client:
            health = (await client.get(f"{server.url}/v1/health")).json()
            assert health["worker"] is False
            tid = await start(client, server, "streamer")
            worker = duragent(
                "worker",
                "--store",
                server.store_url,
                "--agents",
                "server_agents:agents",
                "--poll-interval",
                "0.1",
                log=tmp_path / "worker.log",
            )
            try:
                got: list[Event] = []
                url = f"{server.url}/v1/tasks/{tid}/events"
                end = await read_to_end(client, url, server.headers(), got)
            finally:
                stop(worker)
        assert end.data["status"] == "completed"
        assert [e.id for e in got] == list(range(1, len(got) + 1))
        assert sum(e.event == "progress" for e in got) >= 5, "text arrived as it streamed"
        starts = [e for e in got if e.event == "status" and e.data["payload"]["to"] == "running"]
        assert starts and ":" in starts[0].data["payload"]["worker"]
    # uvicorn's access log has the paths, but no token ever appears in the log.
    text = server.log_text()
    assert "/events" in text
    assert all(token not in text for token in ("alice-live-token-1", "bob-live-token-2"))


async def test_keepalive_comments_while_nothing_happens(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/k.db", agents(), poll_interval=0.05) as rt:
        sub = await rt.submit("approver", "go", owner="alice")
        await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status.value == "waiting")
        last = (await rt.get(sub.task_id)).last_seq
        stream = entry_events(rt.store, sub.task_id, after_seq=last, keepalive=0.05)
        assert await anext(stream) == "retry: 1000\n\n"
        assert await anext(stream) == ": keep-alive\n\n"
        assert await anext(stream) == ": keep-alive\n\n"
        await rt.respond(sub.task_id, approve=True)
        rest = [chunk async for chunk in stream]
        assert rest[-1].startswith("event: end\n")
        ids = [int(c.split("\n")[0][4:]) for c in rest if c.startswith("id: ")]
        assert ids == list(range(last + 1, last + 1 + len(ids)))
