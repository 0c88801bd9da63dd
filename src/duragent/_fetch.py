"""HTTP GET on a model's behalf, kept off the machine's own network.

A model asked to fetch a URL may be steered (by a page it read, say) toward the
services next to it: the store's database, the duragent server, a cloud
metadata endpoint. So by default only public addresses are reached: the host's
RESOLVED addresses are checked, the connection goes to the address that was
checked (no second lookup a DNS answer could change in between), and every
redirect hop is checked the same way. The body is read as a stream and cut at a
size cap, applied both to the bytes on the wire and to what they decode to.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from duragent.errors import UsageError

if TYPE_CHECKING:
    import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]

REDIRECTS = (301, 302, 303, 307, 308)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class BlockedAddress(PermissionError):
    """The URL leads to an address the policy does not allow."""


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses, as the system resolver gives them."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4, Teredo), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def local_kind(address: IPAddress) -> str | None:
    """What kind of non-public address this is ("loopback", "private"...), or None if public."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None and (kind := local_kind(inner)) is not None:
            return f"{kind} (inside {address})"
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("non-global", not address.is_global),
    )
    return next((kind for kind, hit in checks if hit), None)


@dataclass(frozen=True)
class NetworkPolicy:
    """Where `http_get` may connect, and how much it reads.

    `allow_private` lets it reach loopback, private, link-local and the other
    local ranges (`duragent run --allow-private-network`). `public` lists
    networks to treat as public anyway (an allowlist); `resolve` looks names up;
    `verify` is how TLS certificates are checked (httpx's `verify`).
    """

    allow_private: bool = False
    public: tuple[IPNetwork, ...] = ()
    max_bytes: int = 2_000_000
    max_redirects: int = 5
    timeout: float = 30.0
    resolve: Resolver = system_resolve
    verify: ssl.SSLContext | bool = True

    def refusal(self, address: IPAddress) -> str | None:
        """Why this address may not be reached, or None when it may."""
        if self.allow_private or any(address in net for net in self.public):
            return None
        kind = local_kind(address)
        return None if kind is None else f"a {kind} address"


@dataclass
class Fetched:
    url: str  # where the body came from, after redirects
    status: int
    content_type: str
    text: str
    truncated: bool  # the body was longer than the policy's max_bytes


async def _checked_address(url: httpx.URL, policy: NetworkPolicy) -> str:
    """The address to connect to for `url`: every address its host has must be allowed."""
    host = url.raw_host.decode("ascii")  # IDNA-encoded, as DNS and TLS want it
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            names = await policy.resolve(host, port)
            found = [ipaddress.ip_address(a.split("%")[0]) for a in names]
        except OSError as exc:
            raise ConnectionError(f"cannot resolve {host}: {exc}") from None
    if not found:
        raise ConnectionError(f"{host} has no address")
    for address in found:
        why = policy.refusal(address)
        if why is not None:
            raise BlockedAddress(
                f"{url} is refused: {host} is {why} ({address}); local and private networks "
                "are off limits unless the run allows them (--allow-private-network)"
            )
    return str(found[0])


def _checked_url(text: str) -> httpx.URL:
    import httpx

    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise ValueError(f"not a valid URL: {text!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"only http:// and https:// addresses can be fetched, not {text!r}")
    return url


async def fetch(url: str, policy: NetworkPolicy) -> Fetched:
    """GET `url` under `policy`, following redirects; the body cut at `policy.max_bytes`.

    Raises BlockedAddress for an address the policy refuses, ValueError for a
    URL that is not http(s), ConnectionError when the fetch itself fails.
    """
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx comes with the openai/anthropic SDKs
        raise UsageError("http_get needs httpx: pip install httpx") from None
    target = _checked_url(url)
    # trust_env=False: a proxy from the environment would connect on our behalf, unchecked.
    # No keep-alive: we dial addresses, so a kept connection is keyed by address, and a
    # redirect to another name on the same address would reuse it without checking that
    # name's certificate.
    client = httpx.AsyncClient(
        timeout=policy.timeout,
        trust_env=False,
        verify=policy.verify,
        limits=httpx.Limits(max_keepalive_connections=0),
    )
    try:
        async with client:
            return await _follow(client, target, policy)
    except httpx.HTTPError as exc:
        raise ConnectionError(f"GET {url} failed: {exc}") from None


async def _follow(client: httpx.AsyncClient, target: httpx.URL, policy: NetworkPolicy) -> Fetched:
    """GET `target`, and the target of each redirect, each hop checked before it is dialled."""
    for _hop in range(policy.max_redirects + 1):
        address = await _checked_address(target, policy)
        extensions = {}
        if target.scheme == "https":
            # TLS still names (and verifies) the host, though we dial its address.
            extensions["sni_hostname"] = target.raw_host.decode("ascii")
        request = client.build_request(
            "GET",
            target.copy_with(host=address),
            headers={"Host": target.netloc.decode("ascii"), "Accept-Encoding": "identity"},
            extensions=extensions,
        )
        response = await client.send(request, stream=True)
        try:
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location:
                target = _checked_url(str(target.join(location)))
                continue
            body, truncated = await _read_capped(response, policy.max_bytes)
        finally:
            await response.aclose()
        try:
            text = body.decode(response.encoding or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know
            text = body.decode("utf-8", errors="replace")
        return Fetched(
            url=str(target),
            status=response.status_code,
            content_type=response.headers.get("content-type", ""),
            text=text,
            truncated=truncated,
        )
    raise ConnectionError(f"{target}: more than {policy.max_redirects} redirects")


class _Inflate:
    """One layer of gzip or deflate, undone a bounded piece at a time."""

    def __init__(self, encoding: str) -> None:
        self.raw_deflate = encoding == "deflate"  # zlib-wrapped, or (some servers) raw
        self.inflate = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 0))
        self.started = False

    def decode(self, data: bytes, most: int) -> bytes:
        """At most `most` bytes of what `data` decodes to (the rest is dropped: we stop)."""
        try:
            out = self.inflate.decompress(data, most)
        except zlib.error:
            if not (self.raw_deflate and not self.started):
                raise ConnectionError("the response body is not valid compressed data") from None
            self.inflate = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self.decode(data, most)
        self.started = True
        return out

    @property
    def done(self) -> bool:
        # Anything after the end of the stream would pile up in zlib's unused_data.
        return self.inflate.eof


def _decoder(response: httpx.Response) -> _Inflate | None:
    """How to decode the body: one layer of gzip or deflate at most (else refused)."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _Inflate("deflate" if encoding == "deflate" else "gzip")
    # Stacked layers could expand a few hundred bytes into gigabytes before any cap
    # saw them; nobody needs them when we asked for identity.
    raise ConnectionError(f"the response's content encoding {encoding!r} is not supported")


async def _read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether there was more.

    The raw stream is read (httpx's decoded stream would inflate a compressed
    body whole, whatever its size) and decoded here, never past the cap.
    """
    decoder = _decoder(response)
    body = bytearray()
    wire = 0  # bytes received: capped too, for a body that decodes to next to nothing
    async for chunk in response.aiter_raw(65536):
        wire += len(chunk)
        room = limit - len(body)
        # One byte more than there is room for tells "more" from "exactly full".
        data = chunk if decoder is None else decoder.decode(chunk, room + 1)
        if len(data) > room or (decoder is not None and wire > limit):
            body += data[:room]
            return bytes(body), True
        body += data
        if decoder is not None and decoder.done:
            break
    return bytes(body), False
