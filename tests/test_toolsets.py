"""The built-in toolsets hold against a hostile model and a hostile API client (issue 12, 4 and 7).

`http_get` reaches only public addresses unless the run allows more (checked on
the resolved address it then connects to, on every redirect hop) and reads at
most a capped body; the file tools' root is fixed when the toolset is built, and
neither a task's context, nor `..`, nor a symlink moves it.
"""

from __future__ import annotations

import ipaddress
import ssl
import subprocess
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, ToolCall
from duragent._fetch import BlockedAddress, NetworkPolicy, local_kind
from duragent.runtime._tools import Tool
from duragent.toolsets import toolset
from duragent.types import EntryKind, TaskStatus
from support.http import Handler, answer, serving


def http_get(policy: NetworkPolicy | None = None) -> Tool:
    tools = toolset("readonly", network=policy, allow={"http"})
    (tool,) = [t for t in tools if t.name == "http_get"]
    return tool


async def get(url: str, policy: NetworkPolicy | None = None) -> str:
    return str(await http_get(policy).invoke({"url": url}, None))  # type: ignore[arg-type]


# 127.0.0.2 is as local as 127.0.0.1; these tests call it public, through the
# policy's own allowlist, to stand for "a public site" without the internet.
PUBLIC_STAND_IN = ipaddress.ip_network("127.0.0.2/32")


# --- where http_get may connect -----------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.5.6.7",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    ],
)
def test_local_addresses_are_recognised(address: str) -> None:
    assert local_kind(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert local_kind(ipaddress.ip_address(address)) is None


@pytest.mark.slow
async def test_a_local_server_is_refused_by_default_and_reached_when_allowed() -> None:
    with serving(answer("the local secret")) as base:
        port = base.rsplit(":", 1)[1]
        for url in (
            f"{base}/",
            f"http://localhost:{port}/",  # by name: the resolved address is checked
            f"http://[::ffff:127.0.0.1]:{port}/",
            f"http://0.0.0.0:{port}/",
        ):
            with pytest.raises(BlockedAddress, match="allow-private-network"):
                await get(url)
        assert "the local secret" in await get(f"{base}/", NetworkPolicy(allow_private=True))


@pytest.mark.slow
async def test_a_redirect_to_a_local_address_is_refused() -> None:
    policy = NetworkPolicy(public=(PUBLIC_STAND_IN,))
    with (
        serving(answer("the local secret")) as local,
        serving(answer("", 302, Location=f"{local}/secret"), host="127.0.0.2") as public,
        serving(answer("public page"), host="127.0.0.2") as fine,
    ):
        assert "public page" in await get(f"{fine}/", policy)  # the allowed target is reached
        with pytest.raises(BlockedAddress, match=r"127\.0\.0\.1"):
            await get(f"{public}/hop", policy)
        with pytest.raises(BlockedAddress):
            await get(f"{local}/", policy)


@pytest.mark.slow
async def test_the_connection_goes_to_the_address_that_was_checked() -> None:
    """A resolver that answers differently the second time (DNS rebinding) changes nothing:
    the name is looked up once per hop and that address is the one dialled."""
    hosts: list[str] = []

    def record(req: BaseHTTPRequestHandler) -> None:
        hosts.append(req.headers["Host"])
        answer("from the checked address")(req)

    with serving(record, host="127.0.0.2") as base:
        port = int(base.rsplit(":", 1)[1])
        with serving(answer("the local secret"), port=port):
            answers = iter([["127.0.0.2"], ["127.0.0.1"], ["127.0.0.1"]])

            async def rebinding(host: str, port: int) -> list[str]:
                assert host == "rebind.test"
                return next(answers)

            policy = NetworkPolicy(public=(PUBLIC_STAND_IN,), resolve=rebinding)
            text = await get(f"http://rebind.test:{port}/", policy)
    assert "from the checked address" in text and "secret" not in text
    assert hosts == [f"rebind.test:{port}"]  # the server still sees the name asked for


@pytest.mark.slow
async def test_a_huge_response_is_read_only_up_to_the_cap() -> None:
    sent = [0]
    chunk = b"x" * 65536

    def endless(req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("Content-Type", "text/plain")
        req.send_header("Content-Length", str(300 * 1024 * 1024))
        req.end_headers()
        try:
            while sent[0] < 300 * 1024 * 1024:
                req.wfile.write(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass  # the client stopped reading: that is the point

    policy = NetworkPolicy(allow_private=True, max_bytes=1_000_000)
    with serving(endless) as base:
        tracemalloc.start()
        try:
            text = await get(f"{base}/big", policy)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "longer than 1000000 bytes; the rest was not read" in text
    assert peak < 20 * 1024 * 1024, peak  # 300 MB were on offer
    assert sent[0] < 300 * 1024 * 1024


# --- the file tools' root -------------------------------------------------------------


def reader(root: Path, calls: list[ToolCall]) -> Agent:
    return Agent(
        name="reader",
        model=ScriptedModel([calls, "done"]),
        tools=toolset("readonly", root=root, allow={"read"}),
        builtin_tools=BuiltinTools(plan=False),
    )


async def results(agent: Agent, tmp_path: Path, **submit: Any) -> list[dict[str, Any]]:
    async with Runtime(f"sqlite:///{tmp_path}/files.db", [agent], poll_interval=0.05) as rt:
        sub = await rt.submit(agent.name, "read", **submit)
        task = await sub.wait(timeout=30)
        assert task.status is TaskStatus.COMPLETED, task.error
        entries = await rt.store.entries(task.id)
    out = [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]
    # In call order (the calls run in parallel, so results commit as they finish).
    return sorted(out, key=lambda r: int(r["tool_call_id"].rsplit("_", 1)[1]))


async def test_a_task_context_does_not_move_the_root(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("inside the root")
    calls = [
        ToolCall("read_file", {"path": "etc/passwd"}),
        ToolCall("read_file", {"path": "/etc/passwd"}),
        ToolCall("read_file", {"path": "../../../../../etc/passwd"}),
        ToolCall("list_dir", {"path": "/"}),
        ToolCall("read_file", {"path": "mine.txt"}),
    ]
    out = await results(reader(work, calls), tmp_path, context={"workdir": "/"})
    assert [r["outcome"] for r in out] == ["error"] * 4 + ["ok"]
    assert "No such file" in out[0]["content"]  # looked for work/etc/passwd
    assert "outside the working directory" in out[1]["content"]
    assert "'..' is not allowed" in out[2]["content"]
    assert out[4]["content"] == "inside the root"
    assert not any("root:" in r["content"] for r in out)


async def test_a_symlink_cannot_lead_out_of_the_root(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "real.txt").write_text("a real file")
    (work / "passwd").symlink_to("/etc/passwd")
    (work / "etc").symlink_to("/etc")
    (work / "alias.txt").symlink_to(work / "real.txt")  # inside the root: fine
    calls = [
        ToolCall("read_file", {"path": "passwd"}),
        ToolCall("read_file", {"path": "etc/passwd"}),
        ToolCall("list_dir", {"path": "etc"}),
        ToolCall("read_file", {"path": "alias.txt"}),
    ]
    out = await results(reader(work, calls), tmp_path)
    assert [r["outcome"] for r in out] == ["error", "error", "error", "ok"]
    for r in out[:3]:
        assert "outside the working directory" in r["content"]
    assert out[3]["content"] == "a real file"
    assert not any("root:" in r["content"] for r in out)


async def test_reading_and_fetching_ask_first_unless_allowed(tmp_path: Path) -> None:
    asking = {t.name: t.requires_approval for t in toolset("default", root=tmp_path)}
    assert asking == {"read_file": True, "list_dir": True, "write_file": True, "http_get": True}
    granted = toolset("default", root=tmp_path, allow=["read", "http"])
    assert {t.name: t.requires_approval for t in granted} == {
        "read_file": False,
        "list_dir": False,
        "write_file": True,
        "http_get": False,
    }


@pytest.fixture
def tls_site(tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext]]:
    """An HTTPS server on 127.0.0.2 with a certificate for `site.test`; the client's context."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=site.test", "-addext", "subjectAltName=DNS:site.test"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    def handle(req: BaseHTTPRequestHandler) -> None:
        if req.path == "/elsewhere":  # to another name on the same address
            return answer("", 302, Location=f"https://other.test:{port}/")(req)
        answer("over TLS")(req)

    with serving(handle, host="127.0.0.2", tls=server_ctx, keep_alive=True) as base:
        port = int(base.rsplit(":", 1)[1])
        yield port, ssl.create_default_context(cafile=str(cert))


@pytest.mark.slow
async def test_https_dials_the_checked_address_and_still_verifies_the_name(
    tls_site: tuple[int, ssl.SSLContext],
) -> None:
    port, client_ctx = tls_site

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.2"]

    policy = NetworkPolicy(public=(PUBLIC_STAND_IN,), resolve=resolve, verify=client_ctx)
    assert "over TLS" in await get(f"https://site.test:{port}/", policy)
    with pytest.raises(ConnectionError, match=r"not valid for 'other\.test'"):
        await get(f"https://other.test:{port}/", policy)  # same address, wrong name


@pytest.mark.slow
async def test_a_redirect_to_another_name_on_the_same_address_is_verified_again(
    tls_site: tuple[int, ssl.SSLContext],
) -> None:
    """A connection kept alive for site.test must not carry the request for other.test."""
    port, client_ctx = tls_site

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.2"]

    policy = NetworkPolicy(public=(PUBLIC_STAND_IN,), resolve=resolve, verify=client_ctx)
    with pytest.raises(ConnectionError, match=r"not valid for 'other\.test'"):
        await get(f"https://site.test:{port}/elsewhere", policy)


async def test_a_model_cannot_ask_to_read_a_huge_file_whole(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_bytes(b"y" * 3_000_000)
    (read,) = [
        t for t in toolset("readonly", root=tmp_path, allow={"read"}) if t.name == "read_file"
    ]
    for asked in (-1, 10**12):
        text = str(await read.invoke({"path": "big.txt", "max_chars": asked}, None))  # type: ignore[arg-type]
        assert len(text) < 300_000 and "more characters not shown" in text


# --- what a server's Content-Encoding can do to the cap ---------------------------------


def gzipped(data: bytes, layers: int) -> bytes:
    import gzip

    for _ in range(layers):
        data = gzip.compress(data, compresslevel=9)
    return data


def bomb(layers: int) -> Handler:
    """A small body that expands to 50 MB once every gzip layer is undone."""
    body = gzipped(b"\0" * 50 * 1024 * 1024, layers)
    encoding = ", ".join(["gzip"] * layers)

    def handle(req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("Content-Type", "text/plain")
        req.send_header("Content-Encoding", encoding)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    return handle


@pytest.mark.slow
async def test_a_compressed_body_is_capped_after_decoding() -> None:
    policy = NetworkPolicy(allow_private=True, max_bytes=1000)
    with serving(bomb(1)) as base:
        tracemalloc.start()
        try:
            text = await get(f"{base}/bomb", policy)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "longer than 1000 bytes; the rest was not read" in text
    assert peak < 5 * 1024 * 1024, peak  # 50 MB once decoded


@pytest.mark.slow
async def test_a_body_compressed_twice_is_refused_not_expanded() -> None:
    policy = NetworkPolicy(allow_private=True, max_bytes=1000)
    with serving(bomb(2)) as base:
        tracemalloc.start()
        try:
            with pytest.raises(ConnectionError, match=r"'gzip, gzip' is not supported"):
                await get(f"{base}/bomb", policy)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 5 * 1024 * 1024, peak


# --- what else a root may hold: a FIFO, links -------------------------------------------


async def test_a_fifo_in_the_root_is_refused_not_waited_on(tmp_path: Path) -> None:
    import asyncio
    import os

    os.mkfifo(tmp_path / "pipe")
    tools = {t.name: t for t in toolset("default", root=tmp_path, allow={"read", "write"})}
    calls = (("read_file", {"path": "pipe"}), ("write_file", {"path": "pipe", "content": "x"}))
    try:
        for name, args in calls:
            with pytest.raises(PermissionError, match="'pipe' is not a regular file"):
                # Generous: a refusal is immediate; the old code blocked in open() for good.
                await asyncio.wait_for(tools[name].invoke(args, None), timeout=20)  # type: ignore[arg-type]
    finally:
        # Should a thread still be blocked opening the FIFO, open its other end to free it.
        os.close(os.open(tmp_path / "pipe", os.O_RDWR | os.O_NONBLOCK))


async def test_list_dir_shows_links_as_links_without_saying_where_they_lead(
    tmp_path: Path,
) -> None:
    (tmp_path / "real.txt").write_text("12345")
    (tmp_path / "sub").mkdir()
    (tmp_path / "etc").symlink_to("/etc")
    (tmp_path / "passwd").symlink_to("/etc/passwd")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (list_dir,) = [t for t in toolset("readonly", root=tmp_path) if t.name == "list_dir"]
    text = str(await list_dir.invoke({}, None))  # type: ignore[arg-type]
    assert text.splitlines() == [
        "etc  (link)",
        "gone  (link)",
        "passwd  (link)",
        "real.txt  (5 bytes)",
        "sub/",
    ]
    assert "/etc" not in text and str(tmp_path) not in text


# --- what the tools answer names paths relative to the root only (issue 37, item 12) ----


async def test_tool_errors_name_paths_relative_to_the_root_never_the_servers(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    (work / "dir").mkdir(parents=True)
    (work / "file.txt").write_text("x")
    (work / "gone").symlink_to(tmp_path / "elsewhere" / "nowhere")
    calls = [
        ToolCall("read_file", {"path": "missing.txt"}),
        ToolCall("list_dir", {"path": "file.txt"}),
        ToolCall("list_dir", {"path": "nodir"}),
        ToolCall("write_file", {"path": "dir", "content": "x"}),
        ToolCall("write_file", {"path": "file.txt/inner.txt", "content": "x"}),
        ToolCall("read_file", {"path": str(work / "missing.txt")}),  # absolute, inside
        ToolCall("read_file", {"path": "gone"}),
        ToolCall("write_file", {"path": str(work / "new.txt"), "content": "hi"}),
    ]
    agent = Agent(
        name="reader",
        model=ScriptedModel([calls, "done"]),
        tools=toolset("default", root=work, allow={"read", "write"}),
        builtin_tools=BuiltinTools(plan=False),
    )
    out = await results(agent, tmp_path)
    assert [r["outcome"] for r in out] == ["error"] * 7 + ["ok"]
    said = [r["content"] for r in out]
    assert "'missing.txt': No such file or directory" in said[0]
    assert "'file.txt': Not a directory" in said[1]
    assert "'nodir': No such file or directory" in said[2]
    assert "'dir': Is a directory" in said[3]
    assert "'missing.txt': No such file or directory" in said[5]
    assert said[7] == "wrote 2 characters to new.txt"
    assert (work / "new.txt").read_text() == "hi"
    for text in said:
        assert str(tmp_path) not in text, text  # neither the root nor where a link leads
        assert "elsewhere" not in text, text
