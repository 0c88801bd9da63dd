"""A small MCP server for the MCP tool tests, on the official SDK.

python tests/mcp_server.py LEDGER            # stdio
python tests/mcp_server.py LEDGER PORT       # streamable HTTP on 127.0.0.1:PORT
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import Context, MCPServer

LEDGER = sys.argv[1]
server = MCPServer("duragent-test")


def record(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@server.tool()
def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


@server.tool()
def charge(amount: int, idempotency_key: str) -> str:
    """Charge an amount once per idempotency key."""
    record(f"charge {amount} {idempotency_key}")
    return f"charged {amount}"


@server.tool()
async def send(text: str, ctx: Context) -> str:
    """Send a message; records the idempotency key found in the request's _meta."""
    meta = ctx.request_context.meta or {}
    record(f"send {text} {meta.get('io.duragent/idempotency-key')}")
    return "sent"


COUNTER = [0]


@server.tool()
def count() -> str:
    """A counter kept by this process: how many times it was called, and the process id."""
    COUNTER[0] += 1
    return f"{COUNTER[0]} {os.getpid()}"


@server.tool()
async def hold(path: str) -> str:
    """Answers once `path` exists (recording that it waits): a call kept in flight."""
    import asyncio

    record(f"hold {path}")
    while not os.path.exists(path):
        await asyncio.sleep(0.01)
    return f"released {os.getpid()}"


@server.tool()
def crash() -> str:
    """The server process dies during the call (after recording that it ran)."""
    record(f"crash {os.getpid()}")
    os._exit(1)


@server.tool()
def crash_once() -> str:
    """Dies during its first call (the ledger has no run of it yet); answers after that."""
    with open(LEDGER, "a+") as f:
        f.seek(0)
        ran = "crash_once" in f.read()
    record(f"crash_once {os.getpid()}")
    if not ran:
        os._exit(1)
    return "survived"


@server.tool()
def explode() -> str:
    """Always fails."""
    raise ValueError("the server refused")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
