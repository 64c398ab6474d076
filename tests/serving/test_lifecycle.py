"""A real ``cde-st-serve`` process's life and connections: ``/ready`` beside ``/health``, ``X-Request-Id`` on every
answer and log line, the OpenAPI description of the real routes, SIGTERM draining (503 with Retry-After for new
requests, in-flight ones finished, exit 0) and half-open connections closed after the read timeout."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time

import httpx
import pytest
from serving_helpers import Server

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def server(cde_dir, tmp_path_factory):
    """One server for the tests that only ask it things (the SIGTERM test starts its own): its access log at level
    info, a 1 s read timeout and at most 100 connections."""
    folder = tmp_path_factory.mktemp("lifecycle")
    flags = ["--served-model-name", "tiny-cde", "--truncate", "--access-log", "--log-level", "info",
             "--read-timeout-s", "1", "--max-connections", "100"]  # fmt: skip
    started = Server(cde_dir, folder / "server.log", *flags)
    yield started
    started.stop(signal.SIGKILL)


def test_ready_request_ids_and_the_openapi_description(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        ready = http.get("/ready")
        given = http.post(
            "/v1/embeddings", json={"model": "tiny-cde", "input": "rain"}, headers={"X-Request-Id": "abc-123"}
        )
        made = http.get("/v1/models/nope")
        bad = http.get("/health", headers={"X-Request-Id": "has space" + "x" * 200})
        spec = http.get("/openapi.json").json()
        docs = http.get("/docs")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert given.status_code == 200 and given.headers["x-request-id"] == "abc-123"
    assert made.status_code == 404 and re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    assert re.fullmatch(r"[0-9a-f]{32}", bad.headers["x-request-id"])  # an unusable id is replaced
    log = server.output()
    assert "[abc-123]" in log and f"[{made.headers['x-request-id']}]" in log
    # The description names every real route, with its body and the error shape of its statuses.
    assert {"/v1/embeddings", "/v1/contexts", "/v1/contexts/{name}", "/v1/models", "/health", "/ready"} <= set(
        spec["paths"]
    )
    embeddings = spec["paths"]["/v1/embeddings"]["post"]
    body = embeddings["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "input", "truncate", "context", "input_type"} <= set(body["properties"])
    error = embeddings["responses"]["400"]["content"]["application/json"]["schema"]
    assert set(error["properties"]["error"]["required"]) == {"message", "type", "param", "code"}
    assert {"200", "400", "429", "503"} <= set(embeddings["responses"])
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_sigterm_drains_then_exits_0(start_server, cde_dir):
    server = start_server(cde_dir, "--served-model-name", "tiny-cde", "--truncate")
    big = {"model": "tiny-cde", "input": [f"xylophone quartz number {i} " * 3 for i in range(2048)]}
    results = []

    def ask_big():
        with httpx.Client(base_url=server.url, timeout=120) as http:
            results.append(http.post("/v1/embeddings", json=big))

    thread = threading.Thread(target=ask_big)
    thread.start()
    time.sleep(0.5)  # in flight (2048 texts take seconds on this model)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        refused = http.post("/v1/embeddings", json={"model": "tiny-cde", "input": "rain"})
        not_ready = http.get("/ready")
        alive = http.get("/health")
    thread.join(timeout=120)
    code = server.proc.wait(timeout=60)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "shutting_down"
    assert not_ready.status_code == 503 and alive.status_code == 200
    assert len(results) == 1 and results[0].status_code == 200 and len(results[0].json()["data"]) == 2048
    assert code == 0, server.output()


def test_half_open_connections_are_closed_and_health_answers(server):
    host, port = server.url.removeprefix("http://").split(":")
    sockets = []
    try:
        for _ in range(150):  # more than --max-connections, each sending half a request's headers
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
            sockets.append(s)
        deadline, status = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            try:
                status = httpx.get(f"{server.url}/health", timeout=2).status_code
            except httpx.TransportError:
                status = None
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200
        time.sleep(1.5)
        closed = 0
        for s in sockets:
            s.settimeout(2)
            try:
                closed += s.recv(1024) == b""  # the server closed it
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass  # still open: the server kept it
        assert closed == len(sockets)
    finally:
        for s in sockets:
            s.close()


def test_a_request_without_input_type_is_warned_about(server):
    """LangChain's and LlamaIndex's OpenAI embeddings send queries with the documents' body: no input_type. The
    server says, in a header of each such answer and once per client in its log, that they were embedded as
    documents."""
    openai = pytest.importorskip("openai", reason="the tests' client (pip install -e '.[dev]')")
    warned = server.output().count("embedded as documents")  # other clients' warnings (the server is shared)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    for _ in range(3):
        silent = client.embeddings.with_raw_response.create(model="tiny-cde", input="what causes rain?")
    said = client.embeddings.with_raw_response.create(
        model="tiny-cde", input="what causes rain?", extra_body={"input_type": "query"}
    )
    assert "input_type" in silent.headers["x-cde-st-warning"] and "x-cde-st-warning" not in said.headers
    assert server.output().count("embedded as documents") == warned + 1


def _answer(stream) -> dict[str, str]:
    """Read one HTTP/1.1 answer from ``stream``; its headers, lower-cased."""
    assert stream.readline().startswith(b"HTTP/1.1 200")
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    stream.read(int(headers.get("content-length", 0)))
    return headers


def test_a_keep_alive_connection_ends_after_its_request_limit(start_server, plain_dir):
    server = start_server(plain_dir, "--max-requests-per-connection", "3")
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock, sock.makefile("rb") as stream:
        answers = []
        for _ in range(3):
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            answers.append(_answer(stream))
        assert [a.get("connection") for a in answers] == [None, None, "close"]
        assert stream.read(1) == b""  # the server closed it: the client's next connection may go to another worker
    with server.client(key=None) as client:  # a client reconnects by itself
        assert all(client.get("/health").status_code == 200 for _ in range(7))


def test_a_keep_alive_connection_ends_at_its_first_request_past_the_age_limit(start_server, plain_dir):
    """A slow client never reaches a request count: its connection still ends once it is old enough."""
    server = start_server(plain_dir, "--max-connection-age-s", "1")
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock, sock.makefile("rb") as stream:
        answers = []
        for pause in (0, 0, 1.2):
            time.sleep(pause)
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            answers.append(_answer(stream))
        assert [a.get("connection") for a in answers] == [None, None, "close"]
        assert stream.read(1) == b""
