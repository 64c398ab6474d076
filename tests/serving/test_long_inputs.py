"""Inputs longer than the model reads, through real ``cde-st-serve`` processes: refused by default with OpenAI's
400 naming the input and its length, truncated on request or with ``--truncate`` (equal to in-process encode, the
count in the answer), a 5 MB input answered without stalling other clients, and batches bounded in tokens."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import numpy as np
import pytest
from serving_helpers import API_KEY, MAX_SEQ_LENGTH, Server

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")
openai = pytest.importorskip("openai", reason="the tests' client (pip install -e '.[dev]')")

LONG = " ".join(["glacier"] * 100)  # far over MAX_SEQ_LENGTH tokens


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_an_over_long_input_is_refused_unless_the_request_truncates(cde_server, cde_model):
    client = openai.OpenAI(base_url=f"{cde_server.url}/v1", api_key=API_KEY, max_retries=0)
    body = {"model": "tiny-cde", "input": ["short", "tiny", LONG], "truncate": False}
    with cde_server.client() as http:
        refused = http.post("/v1/embeddings", json=body)
        single = http.post("/v1/embeddings", json={**body, "input": LONG})
        kept = http.post("/v1/embeddings", json={**body, "truncate": True, "input_type": "document"})
    assert refused.status_code == 400 and single.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "input[2]" and error["code"] == "context_length_exceeded"
    count = len(cde_model.tokenizer(cde_model.prompts["document"] + LONG)["input_ids"])
    # LONG is cut before tokenising (over 32 words): its length is given as a lower bound
    assert "input[2]" in error["message"] and "32 tokens" in error["message"] and "at least" in error["message"]
    assert int(error["message"].split("at least ")[1].split()[0]) <= count
    medium = " ".join(["glacier"] * 20)  # not cut (20 words), still over 32 tokens: its exact length
    with cde_server.client() as http:
        exact = http.post("/v1/embeddings", json={**body, "input": ["a", medium]}).json()["error"]
    count = len(cde_model.tokenizer(cde_model.prompts["document"] + medium)["input_ids"])
    assert exact["param"] == "input[1]" and f"has {count} tokens" in exact["message"]
    assert single.json()["error"]["param"] == "input"
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.embeddings.create(model="tiny-cde", input=[LONG], extra_body={"truncate": False})
    assert kept.status_code == 200 and kept.json()["truncated_inputs"] == 1
    got = np.array([row["embedding"] for row in kept.json()["data"]], dtype=np.float32)
    default = cde_model.contextual_module.context_vectors
    expected = cde_model.encode(body["input"], prompt=cde_model.prompts["document"], context_vectors=default)
    assert np.abs(got - expected).max() <= 1e-5


def test_a_server_refuses_by_default_and_a_plain_model_is_cut_the_same(start_server, plain_dir):
    from sentence_transformers import SentenceTransformer

    server = start_server(plain_dir, "--served-model-name", "plain")
    with server.client() as http:
        refused = http.post("/v1/embeddings", json={"model": "plain", "input": ["ok", LONG]})
        texts = ["ok", LONG, LONG + " \x00\u2028 tail"]
        kept = http.post("/v1/embeddings", json={"model": "plain", "input": texts, "truncate": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[1]"
    assert kept.status_code == 200 and kept.json()["truncated_inputs"] == 2
    got = np.array([row["embedding"] for row in kept.json()["data"]], dtype=np.float32)
    model = SentenceTransformer(plain_dir)
    model.max_seq_length = MAX_SEQ_LENGTH if model.max_seq_length is None else model.max_seq_length
    assert np.abs(got - model.encode(texts)).max() <= 1e-5


@pytest.fixture(scope="module")
def roomy_server(cde_dir, tmp_path_factory):
    """A server without a key, taking bodies up to 32 MB and forwards of at most 40 tokens (with padding), for the
    tests that only ask it things; they read its metrics as increases."""
    flags = ["--served-model-name", "tiny-cde", "--truncate", "--max-body-mb", "32", "--max-batch-tokens", "40"]
    server = Server(cde_dir, tmp_path_factory.mktemp("roomy") / "server.log", *flags)
    yield server
    server.stop(signal.SIGKILL)


def test_a_5_mb_input_is_cut_before_tokenising_and_others_keep_flowing(roomy_server, cde_model):
    server = roomy_server
    words = ["rain", "forms", "when", "vapour", "condenses", "glacier", "北京", "café", "x" * 150]
    rng = np.random.default_rng(0)
    huge = " ".join(rng.choice(words, size=250_000).tolist())
    assert len(huge) > 5_000_000
    latencies, errors = [], []
    done = threading.Event()

    def short_client():
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for _ in range(200):  # bounded in count; stops once the large request is answered
                if done.is_set():
                    return
                started = time.perf_counter()
                response = http.post("/v1/embeddings", json={"model": "tiny-cde", "input": "what causes rain?"})
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    errors.append(response.text)

    before = _rss_mb(server.proc.pid)
    thread = threading.Thread(target=short_client)
    thread.start()
    started = time.perf_counter()
    with httpx.Client(base_url=server.url, timeout=120) as http:
        answer = http.post("/v1/embeddings", json={"model": "tiny-cde", "input": [huge, "short"]})
    seconds = time.perf_counter() - started
    done.set()
    thread.join(timeout=60)
    after = _rss_mb(server.proc.pid)
    print(
        f"5 MB input answered in {seconds:.2f} s; {len(latencies)} short requests meanwhile, slowest "
        f"{max(latencies, default=0) * 1000:.0f} ms; server RSS {before:.0f} -> {after:.0f} MB"
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["truncated_inputs"] == 1 and not errors
    got = np.array(answer.json()["data"][0]["embedding"], dtype=np.float32)
    default = cde_model.contextual_module.context_vectors
    expected = cde_model.encode([huge], prompt=cde_model.prompts["document"], context_vectors=default)[0]
    assert np.abs(got - expected).max() <= 1e-5
    assert after - before < 400  # the whole text is never tokenised (it took about 3 GB per 27 MB before)


def _batch_sizes(url: str) -> dict[str, float]:
    with httpx.Client(base_url=url) as http:
        lines = http.get("/metrics").text.splitlines()
    return {
        k: float(v) for k, v in (line.rsplit(" ", 1) for line in lines if line.startswith("cde_st_batch_size_texts"))
    }


def test_batches_bounded_in_tokens_still_answer_each_request(roomy_server, cde_model):
    server = roomy_server
    before = _batch_sizes(server.url)
    texts = [f"xylophone quartz {i} " + "zebra " * (i % 3) for i in range(24)]  # spelled letter by letter
    answers = [None] * len(texts)

    def ask(i):
        with httpx.Client(base_url=server.url, timeout=60) as http:
            answers[i] = http.post("/v1/embeddings", json={"model": "tiny-cde", "input": texts[i]})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    got = np.array([a.json()["data"][0]["embedding"] for a in answers], dtype=np.float32)
    default = cde_model.contextual_module.context_vectors
    assert (
        np.abs(got - cde_model.encode(texts, prompt=cde_model.prompts["document"], context_vectors=default)).max()
        <= 1e-5
    )
    metrics = {k: v - before.get(k, 0.0) for k, v in _batch_sizes(server.url).items()}  # this test's forwards
    # Each text is over 20 tokens: 40 tokens with padding hold one text, so every forward had one text.
    prompt = cde_model.prompts["document"]
    assert min(len(cde_model.tokenizer(prompt + t)["input_ids"]) for t in texts) > 20
    assert metrics['cde_st_batch_size_texts_bucket{le="1.0"}'] == metrics["cde_st_batch_size_texts_count"]
    assert metrics["cde_st_batch_size_texts_count"] >= len(texts)


def test_deeply_nested_json_is_a_400(cde_server):
    with cde_server.client() as http:
        response = http.post("/v1/embeddings", content=b"[" * 100_000, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def _metric(url: str, name: str) -> float:
    line = next(line for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith(name + " "))
    return float(line.split()[-1])


def test_requests_of_clients_that_left_are_not_computed(start_server, cde_dir):
    # The first request of a batch waits up to a second for others to fill it: clients that leave after 0.1 s leave
    # while their texts are queued, which must then never reach a forward.
    server = start_server(cde_dir, "--served-model-name", "tiny-cde", "--max-wait-ms", "1000")
    request = {"model": "tiny-cde", "input": ["left"] * 7}
    gone = 0
    for _ in range(3):
        try:
            httpx.post(f"{server.url}/v1/embeddings", json=request, timeout=0.1)
        except httpx.TimeoutException:
            gone += 1
    stayed = httpx.post(f"{server.url}/v1/embeddings", json=request | {"input": ["stayed"] * 5}, timeout=60)
    assert gone == 3 and stayed.status_code == 200 and len(stayed.json()["data"]) == 5
    deadline = time.monotonic() + 30  # the server notices the last client leave on its own time
    while _metric(server.url, "cde_st_abandoned_texts_total") < 21 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(server.url, "cde_st_abandoned_texts_total") == 21
    assert _metric(server.url, "cde_st_batch_size_texts_sum") == 5  # "stayed" only (the warm-up forward is not batched)
