"""The PostgreSQL store's two wires (store/_postgres_message.py): the switch, the
raw wire's preconditions checked when the store opens, and the psycopg wire
running on psycopg's documented API alone."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from conftest import drop_schema, require_postgres
from duragent.errors import StoreError
from duragent.store import Commit, DocumentWrite, TaskPatch, _postgres_wire as wire
from duragent.store._postgres import PostgresStore
from duragent.store._postgres_connect import split_url
from duragent.types import EntryKind, NewEntry, Task

pytestmark = pytest.mark.postgres


@pytest.fixture
def schema() -> Iterator[str]:
    require_postgres()
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(name)


def progress(task_id: str, text: str) -> NewEntry:
    return NewEntry(task_id=task_id, kind=EntryKind.PROGRESS, payload={"text": text})


def test_the_wire_is_taken_out_of_the_url_and_a_wrong_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conninfo, own = split_url("postgresql://h/db?wire=psycopg&sslmode=disable")
    assert own == {"wire": "psycopg"} and conninfo == "postgresql://h/db?sslmode=disable"
    monkeypatch.delenv("DURAGENT_PG_WIRE", raising=False)
    assert PostgresStore("postgresql://h/db").wire == "raw"
    assert PostgresStore("postgresql://h/db?wire=psycopg").wire == "psycopg"
    monkeypatch.setenv("DURAGENT_PG_WIRE", "psycopg")
    assert PostgresStore("postgresql://h/db").wire == "psycopg"
    assert PostgresStore("postgresql://h/db?wire=raw").wire == "raw"  # the URL wins
    with pytest.raises(StoreError, match=r"wire='fast': the PostgreSQL wire is one of raw, psy"):
        PostgresStore("postgresql://h/db?wire=fast")
    monkeypatch.setenv("DURAGENT_PG_WIRE", "libpq")
    with pytest.raises(StoreError, match=r"\$DURAGENT_PG_WIRE='libpq'"):
        PostgresStore("postgresql://h/db")


async def test_the_psycopg_wire_commits_without_the_raw_wire(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path of a commit (a claim, rounds on cached rows, a row changed
    behind the writer's copy, a refused job in a batch) runs with the raw
    wire's entry points broken, and prepares none of its statements."""

    def broken(*args: object, **kwargs: object) -> None:
        raise AssertionError("the raw wire was used")

    url = f"{require_postgres()}?wire=psycopg"
    s = PostgresStore(url, schema=schema, max_size=2)
    other = PostgresStore(url, schema=schema)
    await s.open()
    await other.open()
    try:
        for name in ("send", "send_and_commit", "fly", "RawMessage"):
            monkeypatch.setattr(wire, name, broken)
        task, _ = await s.create_task(Task(agent="a"))
        claimed = await s.claim_task("w1", task_id=task.id)
        assert claimed is not None
        for n in range(3):  # on this process's copy of the row, guarded
            await s.commit(Commit(entries=[progress(task.id, f"{n}")], fence={task.id: 1}))
        # Another process moves the row: the guard misses, the batch reads it again.
        await other.commit(Commit(patches=[TaskPatch(task.id, {"iterations": 7})]))
        rereads = s._writer.rereads
        done = await s.commit(Commit(entries=[progress(task.id, "3")], fence={task.id: 1}))
        assert s._writer.rereads == rereads + 1
        assert done.tasks[task.id].iterations == 7
        await s.commit(Commit(documents=[DocumentWrite("s", "k", {"v": "it's \\ 'quoted'"})]))
        assert (await other.get_document("s", "k")).value == {"v": "it's \\ 'quoted'"}  # type: ignore[union-attr]
        texts = [
            e.payload["text"] for e in await other.entries(task.id) if e.kind is EntryKind.PROGRESS
        ]
        assert texts == ["0", "1", "2", "3"]
        assert s._writer.flights == 0  # never sent from the event loop
        with s._pool.connection() as conn:
            names = [r["name"] for r in conn.execute("SELECT name FROM pg_prepared_statements")]
        assert not [n for n in names if n.startswith("duragent_")]
    finally:
        await s.close()
        await other.close()


async def test_the_raw_wire_refuses_a_session_without_standard_conforming_strings(
    schema: str,
) -> None:
    """Its literals rely on the setting: a store opened on a session without it
    says so at once and names both fixes; the psycopg wire works there."""
    off = f"{require_postgres()}?options=-c%20standard_conforming_strings%3Doff"
    raw = PostgresStore(off, schema=schema)
    with pytest.raises(StoreError, match=r"standard_conforming_strings is off.*wire=psycopg"):
        await raw.open()
    s = PostgresStore(f"{off}&wire=psycopg", schema=schema)
    await s.open()
    try:
        value = {"v": "back\\slash and 'quote'"}
        await s.commit(Commit(documents=[DocumentWrite("s", "k", value)]))
        assert (await s.get_document("s", "k")).value == value  # type: ignore[union-attr]
    finally:
        await s.close()


class _KeyRewriter:
    """A TCP proxy to PostgreSQL that hands its clients a backend key of its own
    (BackendKeyData), as a connection pooler does to route cancel requests."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.target)
                self._sockets += (client, server)
                threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
                threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        """Server to client: the start-up's messages parsed, the key's pid changed."""
        buf = b""
        with contextlib.suppress(OSError):
            while True:
                data = server.recv(65536)
                if not data:
                    return
                buf += data
                while len(buf) >= 5 and len(buf) >= 1 + struct.unpack("!I", buf[1:5])[0]:
                    size = 1 + struct.unpack("!I", buf[1:5])[0]
                    message, buf = buf[:size], buf[size:]
                    if message[:1] == b"K":
                        pid = struct.unpack("!I", message[5:9])[0]
                        message = message[:5] + struct.pack("!I", pid ^ 0x5A5A) + message[9:]
                    client.sendall(message)
                    if message[:1] == b"Z":  # ready: the rest passes unchanged
                        client.sendall(buf)
                        self._pump(server, client)
                        return

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@pytest.mark.parametrize("wire_mode", ["raw", "psycopg"])
async def test_a_pooler_between_the_store_and_the_server_is_refused(
    schema: str, wire_mode: str
) -> None:
    """A session not the store's own (prepared statements, LISTEN and the pid
    ended after a lost commit all belong to one) is found when the store opens."""
    proxy = _KeyRewriter("127.0.0.1", 5432)
    try:
        url = require_postgres().replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        through = f"{url}?sslmode=disable&gssencmode=disable"
        with psycopg.connect(through) as conn:  # the proxy passes everything else
            assert conn.execute("SELECT 1").fetchone() == (1,)
        s = PostgresStore(f"{through}&wire={wire_mode}", schema=schema)
        with pytest.raises(StoreError, match="a connection pooler sits between"):
            await s.open()
    finally:
        proxy.close()
