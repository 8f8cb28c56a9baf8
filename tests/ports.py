"""Ports for the servers the tests start (Ray, SeaweedFS, moto, model servers, dagster dev): free, and below the
kernel's ephemeral range. A port the kernel hands out for `bind(0)` is an ephemeral one, which any outgoing
connection (Ray's gRPC clients, a model download check, a test's HTTP client) may take between the check and the
server's own bind; seen as `address already in use` from `weed mini` and a Ray head under load."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000  # above the well-known services a test box runs (PostgreSQL 5432, Ray's default 6379, 8000s)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(ports: list[int]) -> bool:
    socks = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_ports(n: int, consecutive: bool = False) -> list[int]:
    """`n` distinct ports that bind on 127.0.0.1 now, outside the ephemeral range (`consecutive`: one block, as
    Ray's worker port range needs)."""
    high = _ephemeral_start()
    rng = random.SystemRandom()
    low_range = high - LOWEST < 4 * n  # a box whose ephemeral range starts low: the kernel's own picks are all there is
    for _ in range(200):
        if low_range:
            first = _kernel_ports(1 if consecutive else n)
            ports = list(range(first[0], first[0] + n)) if consecutive else first
        elif consecutive:
            start = rng.randrange(LOWEST, high - n)
            ports = list(range(start, start + n))
        else:
            ports = rng.sample(range(LOWEST, high), n)
        if _bindable(ports):
            return ports
    raise RuntimeError(f"no {n} free ports between {LOWEST} and {high}")


def free_port() -> int:
    return free_ports(1)[0]


def _kernel_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
