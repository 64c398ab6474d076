"""Bounds on connections (cde_st/serving/connections.py), through a real server: a connection that sends no request
head within ``--head-timeout-s`` is closed long before the read timeout, one client address holds at most
``--max-connections-per-peer`` connections, and ``/health`` and ``/ready`` are answered past ``--max-connections``.

Once 1,100 idle sockets made /health and /v1/embeddings answer 503 for up to 30 s, and one client could keep all
others out by reopening them. Clients here come from distinct loopback addresses (127.0.0.2, ...), which Linux
routes to the server on 127.0.0.1 like any other peer."""

from __future__ import annotations

import contextlib
import socket
import time

import httpx
import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")

HELD_HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n"


def _connect(server, source: str, timeout: float = 10) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ends the connection before the socket's timeout, with no answer."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _status(client: httpx.Client, path: str) -> int:
    return client.get(path).status_code


def test_idle_sockets_and_one_greedy_client_keep_no_one_out(start_server, plain_dir):
    server = start_server(plain_dir, "--max-connections", "8", "--max-connections-per-peer", "3",
                          "--head-timeout-s", "1", "--read-timeout-s", "300")  # fmt: skip
    for _ in range(600):  # warmed up: /ready's answer below is about the connections, not the model
        if httpx.get(f"{server.url}/ready", timeout=10).status_code == 200:
            break
        time.sleep(0.1)
    held: list[socket.socket] = []
    # A new connection per request: accepted after the sockets opened before it, so it finds them counted.
    transport = httpx.HTTPTransport(local_address="127.0.0.4", limits=httpx.Limits(max_keepalive_connections=0))
    probe = httpx.Client(base_url=server.url, transport=transport, timeout=30)
    try:
        # Requests whose head arrived and whose body is slow hold a slot until the read timeout (300 s here).
        for source in ["127.0.0.2"] * 3:
            held.append(_connect(server, source))
            held[-1].sendall(HELD_HEAD)
        greedy = _connect(server, "127.0.0.2")  # a fourth connection of the same address
        greedy.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _closed_by_server(greedy), "a client address took more than its share of the connections"
        assert _status(probe, "/v1/models") == 200  # the greedy client left room for others
        for source in ["127.0.0.3"] * 3 + ["127.0.0.5"]:
            held.append(_connect(server, source))
            held[-1].sendall(HELD_HEAD)
        assert _status(probe, "/v1/models") == 503  # 7 held and this one: --max-connections 8 reached
        assert _status(probe, "/health") == 200 and _status(probe, "/ready") == 200  # probes answered anyway
        # A socket that sends nothing, or half a head, is closed after --head-timeout-s, not --read-timeout-s.
        idle, half = _connect(server, "127.0.0.6", timeout=120), _connect(server, "127.0.0.7", timeout=120)
        half.sendall(b"GET /health HTTP/1.1\r\nHost")
        assert _closed_by_server(idle) and _closed_by_server(half)
    finally:
        probe.close()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
