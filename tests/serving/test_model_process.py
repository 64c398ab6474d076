"""Forwards in a process of their own (``Engine(model_process=True)``, ``cde-st-serve --model-process``): the same
embeddings as the engine's own thread for every kind of context, contexts let go are freed in the child, the
weights are shared with the child (not copied), a child that dies fails one batch at most and is replaced, and a
real server answers through it."""

from __future__ import annotations

import gc
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from sample_texts import SHORT_DOCS, TOPIC_DOCS
from sentence_transformers import SentenceTransformer
from serving_helpers import process_running, wait_until_ended

from cde_st import ContextualSentenceTransformer
from cde_st.context_errors import NonFiniteEmbedding
from cde_st.serving.engine import Engine
from cde_st.serving.model_process import ModelProcessFailed

QUERIES = ["what causes rain?", "a much longer query about the weather in the mountains in winter", "ok"]


@pytest.fixture(scope="module")
def engines(cde_dir):
    """An engine with a model process and one without, on equal models."""
    apart = Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde", model_process=True)
    local = Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde")
    yield apart, local
    apart.close()
    local.close()


class _ExitWhenRead:
    """A message part whose unpickling ends the reading process with exit code 3 (a child dying mid-batch)."""

    def __reduce__(self):
        return os._exit, (3,)


def test_embeddings_equal_the_engine_s_own_thread(engines):
    apart, local = engines
    made = [engine.make_context("topics", TOPIC_DOCS, None, seed=3) for engine in engines]
    assert torch.equal(made[0].vectors, made[1].vectors)
    cases = [(apart.model_context, local.model_context), (made[0], made[1]), (None, None)]
    for _ in range(2):  # the second time from the contexts the child kept
        for (context_apart, context_local), input_type in zip(cases * 2, ["query"] * 3 + ["document"] * 3):
            got = apart.embed(QUERIES, input_type, context_apart)
            expected = local.embed(QUERIES, input_type, context_local)
            assert np.abs(got.embeddings - expected.embeddings).max() <= 1e-6
            assert np.array_equal(got.tokens, expected.tokens) and np.array_equal(got.truncated, expected.truncated)
    # the context changes the embeddings (else the equality above proves nothing of contexts)
    assert not np.allclose(
        apart.embed(QUERIES, "query", made[0]).embeddings, apart.embed(QUERIES, "query", None).embeddings
    )
    assert apart.forwards > 0 and apart.cache_stats().contexts == 3  # the child's cache, as of its last forward


def test_a_context_let_go_is_freed_in_the_child(engines):
    apart, _ = engines
    contexts = [apart.make_context(f"c{i}", TOPIC_DOCS, None, seed=10 + i) for i in range(3)]
    for context in contexts:
        apart.embed(["a query"], "query", context)
    before = apart.cache_stats()
    del contexts[0]  # not the active one
    gc.collect()
    apart.embed(["a query"], "query", contexts[0])  # the next batch tells the child, its switch frees them
    after = apart.cache_stats()
    assert after.contexts == before.contexts - 1 and after.bytes < before.bytes


def test_the_weights_are_shared_with_the_child_not_copied(engines):
    apart, _ = engines
    expected = apart.embed(["a query"], "query", None).embeddings
    null_vector = apart.model.contextual_module.null_vector
    saved = null_vector.detach().clone()
    with torch.no_grad():  # in the server's process only: the child reads the same memory
        null_vector.fill_(float("nan"))
    with pytest.raises(NonFiniteEmbedding):  # raised in the child, answered here
        apart.embed(["a query"], "query", None)
    with torch.no_grad():
        null_vector.copy_(saved)
    assert np.array_equal(apart.embed(["a query"], "query", None).embeddings, expected)


def test_a_child_that_dies_fails_one_batch_at_most_and_is_replaced(engines):
    apart, _ = engines
    process = apart.model_process
    expected = apart.embed(QUERIES, "query", apart.model_context).embeddings
    first, starts = process.pid, process.starts
    os.kill(first, signal.SIGKILL)  # between batches: the next batch starts a new child first
    deadline = time.monotonic() + 10
    while process.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert np.array_equal(apart.embed(QUERIES, "query", apart.model_context).embeddings, expected)
    assert process.starts == starts + 1 and process.pid != first
    # during a batch: that batch fails with a retryable error (503 in a server), the next one is served
    message = process._message
    process._message = lambda *args: (*message(*args)[:3], [_ExitWhenRead()], None)
    try:
        with pytest.raises(ModelProcessFailed, match="exit code 3"):
            apart.embed(QUERIES, "query", apart.model_context)
    finally:
        process._message = message
    assert np.array_equal(apart.embed(QUERIES, "query", apart.model_context).embeddings, expected)
    assert process.starts == starts + 2


def test_ready_follows_the_child_and_ensure_ready_replaces_it(engines):
    """What /ready reads: a child that ended is not ready, even before anything is sent to it; ensure_ready (the
    server's watch) starts a new one without a batch."""
    apart, _ = engines
    process = apart.model_process
    process.ensure_ready()
    assert process.ready
    first, starts = process.pid, process.starts
    os.kill(first, signal.SIGKILL)
    # Not ready once it has ended: /proc says "zombie" as soon as its main thread exits, its pipes close (and a
    # waitpid reports it) when its last thread has.
    _until(lambda: not process.ready, "the ended child seen as not ready", limit=30)
    assert not process.running
    process.ensure_ready()
    assert process.ready and process.pid != first and process.starts == starts + 1


def test_close_ends_the_child(plain_dir):
    engine = Engine(SentenceTransformer(plain_dir), model_process=True)
    local = Engine(SentenceTransformer(plain_dir))
    try:  # a plain model is served the same way
        got, expected = engine.embed(SHORT_DOCS, None, None), local.embed(SHORT_DOCS, None, None)
        assert np.abs(got.embeddings - expected.embeddings).max() <= 1e-6
        pid = engine.model_process.pid
        assert process_running(pid)
    finally:
        engine.close()
        local.close()
    assert wait_until_ended(pid) and engine.model_process.pid is None


def test_a_child_that_cannot_start_says_why(cde_dir, monkeypatch):
    """Sharing the weights fails where shared memory is too small (a container's 64 MB /dev/shm): the error says
    so instead of a bare RuntimeError from torch."""

    def no_room(self):
        raise RuntimeError("unable to write to file </torch_1_2>: No space left on device (28)")

    monkeypatch.setattr(torch.multiprocessing.get_context("spawn").Process, "start", no_room)
    with pytest.raises(ModelProcessFailed, match=r"shared memory \(/dev/shm\).*--shm-size"):
        Engine(ContextualSentenceTransformer(cde_dir), model_process=True)


def test_a_model_off_the_cpu_is_refused_with_the_option_named(cde_dir, monkeypatch):
    model = ContextualSentenceTransformer(cde_dir)
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda", 0)))
    with pytest.raises(ValueError, match="--model-process"):
        Engine(model, model_process=True)


def _model_child(server_pid: int) -> int:
    """The server's model process: its child running multiprocessing's spawn (not the resource tracker)."""
    found = _model_children(server_pid)
    if not found:
        raise AssertionError("the server has no model process")
    return found[0]


def _model_children(server_pid: int) -> list[int]:
    children = []
    for thread in Path(f"/proc/{server_pid}/task").iterdir():  # a child is listed under the thread that started it
        try:
            children += (thread / "children").read_text().split()
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    found = []
    for pid in children:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except FileNotFoundError:
            continue
        if b"spawn_main" in command and process_running(int(pid)):
            found.append(int(pid))
    return found


def _until(condition, what: str, limit: float = 180):
    """Poll ``condition`` (bounded in time: a model process starts in seconds, a busy machine's minute allowed)."""
    deadline = time.monotonic() + limit
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {limit} s"
        time.sleep(0.1)
    return value


def _ready(server) -> int:
    with server.client(key=None, timeout=30) as client:
        return client.get("/ready").status_code


def _embed(server, texts: list[str], context: str = "default") -> np.ndarray:
    with server.client() as client:
        response = client.post(
            "/v1/embeddings", json={"model": "tiny-cde", "input": texts, "input_type": "query", "context": context}
        )
    assert response.status_code == 200, response.text
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")
def test_a_server_answers_through_its_model_process_and_readiness_follows_it(
    cde_dir, cde_model, start_server, tmp_path
):
    """A fresh `python -m cde_st.serving`, as users run it (the model process is spawned from that interpreter),
    answers through its model process. A model process killed while it loads, or after it served, is replaced
    without waiting for a request, and /ready answers 503 until the new one has answered (once /ready stayed 503 for
    good while embeddings were 200); a batch sent meanwhile gets 503 with Retry-After at worst. One server for both:
    its start and each model process's cost seconds of importing torch."""
    pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")
    killed: list[int] = []

    def kill_it_while_it_loads(proc) -> None:  # its interpreter takes seconds to import torch: it is still loading
        child = _until(lambda: proc.poll() is None and _model_children(proc.pid), "the model process starting")[0]
        os.kill(child, signal.SIGKILL)
        killed.append(child)

    server = start_server(cde_dir, "--model-process", "--served-model-name", "tiny-cde", "--truncate", "--state-dir",
                          str(tmp_path / "state"), fresh=True, started=kill_it_while_it_loads)  # fmt: skip
    _until(lambda: _ready(server) == 200, "/ready after the model process was killed while loading")
    first = _model_child(server.proc.pid)
    assert first != killed[0]
    expected = cde_model.encode(QUERIES, prompt=cde_model.prompts["query"])
    assert np.abs(_embed(server, QUERIES) - expected).max() <= 1e-5
    with server.client() as client:
        created = client.post("/v1/contexts", json={"name": "topics", "documents": TOPIC_DOCS, "seed": 0})
        assert created.status_code == 201, created.text
    vectors = cde_model.embed_context(TOPIC_DOCS, seed=0)
    in_context = cde_model.encode(QUERIES, prompt=cde_model.prompts["query"], context_vectors=vectors)
    assert np.abs(_embed(server, QUERIES, "topics") - in_context).max() <= 1e-5
    os.kill(first, signal.SIGKILL)
    # Not ready once it has ended (its last thread gone), until a new one, started without a request, answered.
    _until(lambda: _ready(server) == 503, "/ready answering 503 for the ended model process", limit=30)
    body = {"model": "tiny-cde", "input": QUERIES, "input_type": "query", "context": "topics"}
    with server.client() as client:
        meanwhile = client.post("/v1/embeddings", json=body)
    assert meanwhile.status_code == 200 or (meanwhile.status_code == 503 and meanwhile.headers["retry-after"])
    _until(lambda: _ready(server) == 200, "/ready after the model process was killed")
    replaced = _model_child(server.proc.pid)
    assert replaced != first
    assert np.abs(_embed(server, QUERIES, "topics") - in_context).max() <= 1e-5
    with server.client() as client:
        metrics = client.get("/metrics").text
    assert re.search(r"^cde_st_forwards_total [1-9]", metrics, re.M)
    assert server.stop() == 0  # SIGTERM: the server ends its model process
    assert wait_until_ended(replaced)
