"""A worker behind a real network link that the test partitions: a network namespace.

A loopback proxy cannot show TCP keepalives or `tcp_user_timeout` at work: the
kernel on both ends answers the probes. Here the worker runs in a network
namespace of its own, joined to the root namespace through a third one that
routes between them (veth pairs), and `partition` makes that router drop every
packet both ways (blackhole routes; this kernel has no `tc netem`): nothing is
closed, no RST or FIN is sent, both ends' links stay up, as when a network
between two hosts fails in the middle.

The server must see the worker's own TCP connection, not a forwarder's (a
forwarder would keep its link to the server alive and the server's keepalives
would have nothing to act on), and the test server listens on 127.0.0.1 only
(with no iptables here to DNAT to it). So the tests get a PostgreSQL cluster of
their own (`ScratchCluster`: initdb in a temporary directory, run as the
postgres user), listening on the root namespace's end of the link, with
trust for the link's /29 only; it is stopped and deleted afterwards. The test's own
sessions reach it from the root namespace over loopback, which the partition
does not touch.

Names (namespaces, veth ends, the /29) come from the test process's pid, so
concurrent test runs do not collide; everything is removed in a finalizer.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import IN_CI


def _pg_bin() -> Path:
    """The newest PostgreSQL's programs installed (Debian's layout), else those on $PATH."""
    installed = Path("/usr/lib/postgresql").glob("*/bin/initdb")
    found = sorted((p for p in installed if p.parts[-3].isdigit()), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else Path("/nonexistent")


PG_BIN = _pg_bin()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@functools.cache
def netns_unavailable() -> str | None:
    """Why this process cannot create a network namespace and a cluster, or None."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    if not (PG_BIN / "initdb").exists() or shutil.which("runuser") is None:
        return f"no PostgreSQL binaries in {PG_BIN} or no runuser"
    probe = f"duragent-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` is not permitted here: {exc.stderr.decode().strip()}"
    except OSError as exc:
        return f"`ip netns add` failed: {exc}"
    _ip("netns", "delete", probe)
    return None


def require_netns() -> None:
    """Skip where namespaces cannot be made, except in CI, which must run these tests."""
    reason = netns_unavailable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI must run the network namespace tests: {reason}")
        pytest.skip(reason)


class Link:
    """The worker's namespace, reaching the root namespace through a router namespace.

    worker namespace (`peer`) -- veth -- router namespace -- veth -- root namespace (`host`),
    on a /29 of their own (two /30s). `partition` makes the router drop, silently,
    every packet between the two ends (blackhole routes): both ends' links stay
    up and their kernels send as usual, and nothing answers, as when a network
    between two hosts fails somewhere in the middle.
    """

    def __init__(self) -> None:
        pid = os.getpid() & 0x1FFFFF  # 2**21 /29 subnets in 10.0.0.0/8
        base = (10 << 24) | (pid << 3)

        def address(offset: int) -> str:
            return ".".join(str((base + offset) >> s & 255) for s in (24, 16, 8, 0))

        self.subnet = f"{address(0)}/29"
        self.host, self._router_host_side = address(1), address(2)
        self._router_peer_side, self.peer = address(5), address(6)
        self.namespace, self.router = f"duragent-{pid}-w", f"duragent-{pid}-r"
        self._devs = {end: f"dav{pid}{end}" for end in "hbaw"}  # host, router: b, a; worker
        self.partitioned = False

    def create(self) -> None:
        ns, router, dev = self.namespace, self.router, self._devs
        self.remove()  # what a killed run of a process with the same pid left behind
        _ip("netns", "add", ns)
        _ip("netns", "add", router)
        _ip("link", "add", dev["h"], "type", "veth", "peer", "name", dev["b"], "netns", router)
        _ip("link", "add", dev["w"], "netns", ns, "type", "veth", "peer", "name", dev["a"])
        _ip("link", "set", dev["a"], "netns", router)
        _ip("addr", "add", f"{self.host}/30", "dev", dev["h"])
        _ip("link", "set", dev["h"], "up")
        _ip("route", "add", f"{self.peer}/32", "via", self._router_host_side)
        _ip("-n", router, "addr", "add", f"{self._router_host_side}/30", "dev", dev["b"])
        _ip("-n", router, "addr", "add", f"{self._router_peer_side}/30", "dev", dev["a"])
        for name in (dev["a"], dev["b"], "lo"):
            _ip("-n", router, "link", "set", name, "up")
        subprocess.run(
            ["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        _ip("-n", ns, "addr", "add", f"{self.peer}/30", "dev", dev["w"])
        _ip("-n", ns, "link", "set", dev["w"], "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self._router_peer_side)

    def remove(self) -> None:
        for ns in (self.namespace, self.router):  # each takes its ends of the pairs
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "delete", ns)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "delete", self._devs["h"])

    def _blackholes(self, verb: str) -> None:
        for address in (self.peer, self.host):
            _ip("-n", self.router, "route", verb, "blackhole", f"{address}/32")

    def partition(self) -> None:
        """Every packet between the worker and the root namespace dropped; no socket is told."""
        self._blackholes("add")
        self.partitioned = True

    def heal(self) -> None:
        if self.partitioned:
            self.partitioned = False
            self._blackholes("del")


class ScratchCluster:
    """A PostgreSQL cluster of the test's own, listening on `address` only."""

    def __init__(self, address: str, trusted: str) -> None:
        self.address = address
        self.dir = Path(tempfile.mkdtemp(prefix="duragent-netns-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.trusted = trusted

    def url(self, **query: str) -> str:
        tail = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgresql://postgres@{self.address}:5432/postgres" + (f"?{tail}" if tail else "")

    def _as_postgres(self, *cmd: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *cmd], check=True, capture_output=True, timeout=120
        )

    def start(self) -> None:
        initdb = PG_BIN / "initdb"
        self._as_postgres(str(initdb), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '{self.address}'\nport = 5432\n"
                "unix_socket_directories = ''\nfsync = off\n"
            )
        with (self.data / "pg_hba.conf").open("w") as hba:
            hba.write(f"host all all {self.trusted} trust\n")
        log = str(self.dir / "log")
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", log, "-w", "start")

    def stop(self) -> None:
        pg_ctl = str(PG_BIN / "pg_ctl")
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._as_postgres(pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def partitionable() -> Iterator[tuple[Link, ScratchCluster]]:
    """The link and the cluster behind it, both gone afterwards whatever happened."""
    require_netns()
    link = Link()
    cluster: ScratchCluster | None = None
    try:
        link.create()
        cluster = ScratchCluster(link.host, link.subnet)
        cluster.start()
        yield link, cluster
    finally:
        if cluster is not None:
            cluster.stop()
        link.remove()


class Worker:
    """support/netns_worker.py run inside the namespace: one JSON line per command."""

    def __init__(self, link: Link, url: str, schema: str, lease_ttl: float) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        cmd = ["ip", "netns", "exec", link.namespace, sys.executable, "-m", "support.netns_worker"]
        self.proc = subprocess.Popen(
            [*cmd, url, schema, str(lease_ttl)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def ask(self, *command: str, timeout: float = 120) -> dict[str, Any]:
        """The worker's answer; fails (rather than hangs) if none comes in `timeout` s."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join(command) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"the worker in the namespace did not answer {command} in {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"the worker in the namespace exited ({self.proc.wait()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate()  # and closes its pipes
