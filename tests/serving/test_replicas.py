"""Replicas: real ``cde-st-serve`` processes sharing one state directory on loopback. A context created, replaced
or deleted through one is served by the other within the documented delay; two creates of one name give one 201
and one 409; a replica killed inside a context write leaves every replica serving the old context, never a mix;
a damaged stored context is answered as damaged and can be replaced."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from sample_texts import SHORT_DOCS, TOPIC_DOCS
from serving_helpers import API_KEY, API_KEY_ENV, Server

from cde_st.serving.contexts import PAUSE_ENV

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")

MODEL = "tiny-cde"
REFRESH_S = 0.2
QUERIES = ["what causes rain?", "how do bees make honey?", "who painted the mona lisa?"]  # shorter than the limit
# What a test allows for a replica to see another's write: the refresh interval and a margin for a busy machine.
SEEN_WITHIN_S = 10.0


def _flags(state: Path) -> list[str]:
    return ["--state-dir", str(state), "--served-model-name", MODEL, "--api-key-env", API_KEY_ENV,
            "--context-refresh-s", str(REFRESH_S)]  # fmt: skip


def _embed(server, name: str, texts=QUERIES) -> httpx.Response:
    with server.client() as client:
        return client.post("/v1/embeddings", json={"model": MODEL, "input": texts, "context": name})


def _vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)


def _create(server, name: str, documents, seed: int = 0, replace: bool = False) -> httpx.Response:
    with server.client(timeout=90) as client:
        body = {"name": name, "documents": documents, "seed": seed, "replace": replace}
        return client.post("/v1/contexts", json=body)


def _until(condition, what: str, limit: float = SEEN_WITHIN_S):
    """Poll ``condition`` (bounded in time) until it gives a true value; the time it took and that value."""
    started = time.monotonic()
    while True:
        value = condition()
        if value:
            return time.monotonic() - started, value
        assert time.monotonic() - started < limit, f"{what}: not within {limit} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def shared_state(tmp_path_factory) -> Path:
    """The state directory of :func:`replicas`."""
    return tmp_path_factory.mktemp("replicas") / "state"


@pytest.fixture(scope="module")
def replicas(cde_dir, shared_state):
    """Two replicas on one state directory, shared by the tests that only write contexts of their own names
    through them (a test that kills or restarts a replica starts its own)."""
    servers = []
    try:
        for i in range(2):
            servers.append(Server(cde_dir, shared_state.parent / f"replica-{i}.log", *_flags(shared_state)))
        yield servers
    finally:
        for server in servers:
            server.stop(signal.SIGKILL)


def test_a_context_written_through_one_replica_is_served_by_the_other(replicas):
    a, b = replicas
    made = _create(a, "shared", TOPIC_DOCS)
    assert made.status_code == 201, made.text
    _until(lambda: _embed(b, "shared").status_code == 200, "a create seen by the other replica")
    answer = _embed(b, "shared")
    assert answer.json()["context"]["fingerprint"] == made.json()["fingerprint"]
    assert np.array_equal(_vectors(answer), _vectors(_embed(a, "shared")))
    replaced = _create(b, "shared", SHORT_DOCS, seed=3, replace=True)
    assert replaced.status_code == 201 and replaced.json()["fingerprint"] != made.json()["fingerprint"]
    new = replaced.json()["fingerprint"]
    _until(lambda: _embed(a, "shared").json().get("context", {}).get("fingerprint") == new, "a replace seen")
    assert np.array_equal(_vectors(_embed(a, "shared")), _vectors(_embed(b, "shared")))
    with a.client() as client:
        assert client.delete("/v1/contexts/shared").status_code == 200
    _until(lambda: _embed(b, "shared").status_code == 404, "a delete seen by the other replica")
    assert _embed(b, "shared").json()["error"]["code"] == "context_not_found"


def test_two_creates_of_one_name_through_two_replicas(replicas):
    statuses, barrier = [], threading.Barrier(2)

    def post(server):
        barrier.wait()
        statuses.append(_create(server, "raced", TOPIC_DOCS, seed=len(statuses)).status_code)

    threads = [threading.Thread(target=post, args=(server,)) for server in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert sorted(statuses) == [201, 409]
    fingerprints = [_until(lambda s=s: _embed(s, "raced").json().get("context"), "the winner")[1] for s in replicas]
    assert fingerprints[0] == fingerprints[1]  # both serve the one that was stored


def test_a_replica_killed_inside_a_write_leaves_old_or_new_never_a_mix(replicas, shared_state, cde_dir, start_server):
    state, steady = shared_state, replicas[0]
    made = _create(steady, "kept", SHORT_DOCS)
    assert made.status_code == 201
    baseline = _vectors(_embed(steady, "kept"))
    # The test hook holds every write of this replica between the fsynced temporary file and its rename.
    doomed = start_server(cde_dir, *_flags(state), env={PAUSE_ENV: "60"})

    def replace():
        try:
            _create(doomed, "kept", TOPIC_DOCS, seed=5, replace=True)
        except httpx.HTTPError:  # the server dies under the request: no answer is expected
            pass

    writer = threading.Thread(target=replace, daemon=True)
    writer.start()
    folder = state / "contexts"
    _until(lambda: any(p.name.startswith(".tmp-") for p in folder.iterdir()), "the write starting", limit=60)
    doomed.stop(signal.SIGKILL)
    writer.join(timeout=30)
    restarted = start_server(cde_dir, *_flags(state))
    for server in (steady, restarted):
        answer = _embed(server, "kept")
        assert answer.json()["context"]["fingerprint"] == made.json()["fingerprint"]
        assert np.array_equal(_vectors(answer), baseline)
    # the leftover was removed (the other tests' contexts share the folder)
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith((".tmp-", "kept"))) == ["kept.safetensors"]
    replaced = _create(restarted, "kept", TOPIC_DOCS, seed=5, replace=True)  # writes go on after the kill
    assert replaced.status_code == 201
    new = replaced.json()["fingerprint"]
    _until(lambda: _embed(steady, "kept").json()["context"]["fingerprint"] == new, "the later replace")


def test_a_damaged_stored_context_is_answered_as_damaged(replicas, shared_state, cde_dir, start_server):
    # Damage outside a write (a disk's, a hand edit's): the running replicas notice the file changed as a replica
    # started afterwards reads it, and all answer alike (they once kept serving it from memory).
    assert _create(replicas[0], "fragile", TOPIC_DOCS).status_code == 201
    assert _embed(replicas[1], "fragile").status_code == 200
    path = shared_state / "contexts" / "fragile.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x7F  # one float of the vectors: still a valid safetensors file
    path.write_bytes(bytes(data))
    second = start_server(cde_dir, *_flags(shared_state))
    for replica in replicas:
        _until(lambda replica=replica: _embed(replica, "fragile").status_code == 409, "the damage being noticed")
    for server in (*replicas, second):
        for response in (_embed(server, "fragile"), server.client().get("/v1/contexts/fragile")):
            assert response.status_code == 409, response.text
            error = response.json()["error"]
            assert error["code"] == "context_damaged" and "checksum" in error["message"]
    assert _create(second, "fragile", TOPIC_DOCS).status_code == 409  # it exists: replace or delete it
    assert _create(second, "fragile", TOPIC_DOCS, replace=True).status_code == 201
    assert np.isfinite(_vectors(_embed(second, "fragile"))).all()
    with second.client(key=API_KEY) as client:
        assert client.delete("/v1/contexts/fragile").status_code == 200
