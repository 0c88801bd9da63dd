"""What one client address may take from a live `duragent serve` (issue 37, items 7
and 10): its own share of the connections, not all of them; wrong tokens are
throttled, valid ones never; X-Forwarded-For is believed from configured proxies only."""

from __future__ import annotations

import selectors
import socket
import time
from pathlib import Path

import httpx
import pytest

from support.server_live import LiveServer, live_server

WRONG = "wrong-token-0123456789"
HALF_SENT = b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nX-Slow: "


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def from_address(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)


def flood(server: LiveServer, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(server.host_port, timeout=30)
        s.sendall(HALF_SENT)
        socks.append(s)
    return socks


def answers_until_closed(socks: list[socket.socket], n: int, timeout: float) -> list[bytes]:
    """What the server sent on the first `n` of `socks` it closed (waits for n)."""
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    done: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(done) < n:
        assert time.monotonic() < deadline, f"{len(done)} of {n} connections closed"
        for key, _ in sel.select(timeout=1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                got[sock] = got.get(sock, b"") + data
            else:
                sel.unregister(sock)
                done.append(got.get(sock, b""))
    sel.close()
    return done


@pytest.mark.slow
def test_one_address_cannot_take_every_connection(tmp_path: Path) -> None:
    args = ["--max-connections", "200", "--max-connections-per-address", "50"]
    with live_server(tmp_path, workers=1, args=[*args, "--header-timeout", "120"]) as server:
        held = flood(server, 300)  # more than --max-connections, all from 127.0.0.1
        try:
            refused = answers_until_closed(held, 250, timeout=60)
            assert all(a.startswith(b"HTTP/1.1 429 ") for a in refused), refused[0]
            assert b"--max-connections-per-address" in refused[0]
            # Another address is served while the flood holds its 50.
            with from_address("127.0.0.2") as other:
                r = other.get(f"{server.url}/v1/me", headers=server.headers("bob"))
                assert r.status_code == 200, r.text
            # The flooding address itself gets a 429, not a slot.
            r = httpx.get(f"{server.url}/v1/me", headers=server.headers(), timeout=30)
            assert r.status_code == 429
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/v1/me", headers=server.headers(), timeout=30).is_error:
            assert time.monotonic() < deadline, "still refused after the flood closed"
        assert "Traceback" not in server.log_text()


@pytest.mark.slow
def test_a_valid_token_is_admitted_from_an_address_throttled_for_wrong_ones(
    tmp_path: Path,
) -> None:
    with live_server(tmp_path, workers=1, args=["--auth-failures-per-minute", "5"]) as server:
        me = f"{server.url}/v1/me"
        for _ in range(5):
            assert httpx.get(me, headers=bearer(WRONG), timeout=30).status_code == 401
        throttled = httpx.get(me, headers=bearer(WRONG), timeout=30)
        assert throttled.status_code == 429 and 1 <= int(throttled.headers["retry-after"]) <= 60
        # A neighbour's wrong tokens lock nobody out: a valid token is checked and admitted.
        r = httpx.get(me, headers=server.headers(), timeout=30)
        assert r.status_code == 200 and r.json() == {"user": "alice", "admin": False}
        # X-Forwarded-For from a peer that is not a configured proxy changes nothing.
        for i in range(5):
            forged = bearer(WRONG, **{"X-Forwarded-For": f"10.9.9.{i}"})
            assert httpx.get(me, headers=forged, timeout=30).status_code == 429


@pytest.mark.slow
def test_forwarded_addresses_are_believed_from_configured_proxies_only(tmp_path: Path) -> None:
    args = ["--auth-failures-per-minute", "3", "--forwarded-allow-ips", "127.0.0.1"]
    with live_server(tmp_path, workers=1, args=args) as server:
        me = f"{server.url}/v1/me"
        mallory = bearer(WRONG, **{"X-Forwarded-For": "10.0.0.1"})
        for _ in range(3):
            assert httpx.get(me, headers=mallory, timeout=30).status_code == 401
        assert httpx.get(me, headers=mallory, timeout=30).status_code == 429
        # The proxy's other clients are counted apart from mallory.
        carol = bearer(WRONG, **{"X-Forwarded-For": "10.0.0.2"})
        assert httpx.get(me, headers=carol, timeout=30).status_code == 401
        # From 127.0.0.2, not a proxy, the header is not read: the peer is the client.
        with from_address("127.0.0.2") as other:
            for _ in range(3):
                assert other.get(me, headers=mallory).status_code == 401
            assert other.get(me, headers=carol).status_code == 429
