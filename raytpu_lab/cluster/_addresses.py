"""Addresses and ports of emulated nodes: free TCP ports and a loopback address per host."""

from __future__ import annotations

import contextlib
import random
import socket

import psutil

__all__ = ["free_ports", "loopback_prefix", "host_ip"]

def free_ports(n: int, ip: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``ip`` right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((ip, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()



def loopback_prefix() -> str:
    """A ``127.K.`` prefix no listening socket on this machine uses: the emulated hosts of one
    cluster get their own loopback addresses ``127.K.x.y`` (Linux routes all of 127/8 to lo)."""
    used = set()
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="inet4"):
            if conn.laddr and conn.laddr.ip.startswith("127."):
                used.add(int(conn.laddr.ip.split(".")[1]))
    free = [k for k in range(2, 255) if k not in used]
    return f"127.{random.choice(free)}."



def host_ip(prefix: str, index: int) -> str:
    """The address of the ``index``-th host (0-based) under ``prefix`` (``"127.K."``)."""
    return f"{prefix}{index // 250}.{index % 250 + 1}"
