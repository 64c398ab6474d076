"""The HTTP API of a real ``cde-st-serve`` process, through the official ``openai`` client and ``httpx``: answers
equal in-process ``encode`` with the same context, contexts as resources, every bad input in OpenAI's error shape,
a plain model served the same way, overload, and a bounded load test."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time

import httpx
import numpy as np
import pytest
from sample_texts import SHORT_DOCS, TOPIC_DOCS
from serving_helpers import API_KEY, CONTEXT_SIZE

pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")
OpenAI = pytest.importorskip("openai", reason="the tests' client (pip install -e '.[dev]')").OpenAI

MODEL = "tiny-cde"
QUERIES = ["what causes rain?", "who painted the mona lisa?", "how do bees make honey?"]


def embeddings(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [row["index"] for row in data] == list(range(len(data)))
    return np.array([row["embedding"] for row in data], dtype=np.float32)


def create(client: httpx.Client, name: str, documents=TOPIC_DOCS, size=CONTEXT_SIZE, seed=0, **extra):
    return client.post("/v1/contexts", json={"name": name, "documents": documents, "size": size, "seed": seed, **extra})


def assert_error(response: httpx.Response, status: int, code: str | None = None, param: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.fixture(scope="module")
def topics(cde_server, cde_model):
    """The context "topics" on the shared server, and its in-process first-stage vectors."""
    with cde_server.client() as client:
        response = create(client, "topics", replace=True)
    assert response.status_code == 201, response.text
    return response.json(), cde_model.embed_context(TOPIC_DOCS, seed=0)


def test_openai_client_matches_in_process_encode(cde_server, cde_model, topics):
    described, vectors = topics
    assert described["fingerprint"] == cde_model.contextual_module.embed_context(TOPIC_DOCS, seed=0)[1].fingerprint
    client = OpenAI(base_url=f"{cde_server.url}/v1", api_key=API_KEY, max_retries=0)
    for input_type, prompt in [("query", cde_model.prompts["query"]), ("document", cde_model.prompts["document"])]:
        texts = QUERIES if input_type == "query" else SHORT_DOCS
        answer = client.embeddings.create(
            model=MODEL, input=texts, extra_body={"context": "topics", "input_type": input_type}
        )  # the client asks for base64 and decodes it
        got = np.array([row.embedding for row in answer.data], dtype=np.float32)
        expected = cde_model.encode(texts, prompt=prompt, context_vectors=vectors)
        assert np.abs(got - expected).max() <= 1e-5
        assert answer.model_extra["context"] == {"name": "topics", "fingerprint": described["fingerprint"]}
        assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(texts)
    # Another context gives other embeddings: the context is really read.
    other = client.embeddings.create(
        model=MODEL, input=QUERIES, extra_body={"context": "default", "input_type": "query"}
    )
    assert np.abs(np.array([row.embedding for row in other.data]) - got[: len(QUERIES)]).max() > 1e-3


def test_float_and_base64_agree_and_absent_input_type_is_document(cde_server, cde_model, topics):
    _, vectors = topics
    with cde_server.client() as client:
        body = {"model": MODEL, "input": SHORT_DOCS[:3], "context": "topics"}
        floats = embeddings(client.post("/v1/embeddings", json=body))
        coded = client.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()["data"]
        as_document = embeddings(client.post("/v1/embeddings", json={**body, "input_type": "document"}))
    decoded = np.stack([np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in coded])
    assert np.array_equal(decoded, floats)  # JSON floats parse back to the exact float32 values
    assert np.array_equal(floats, as_document)  # no input_type: what encode() applies, the document prompt
    expected = cde_model.encode(SHORT_DOCS[:3], context_vectors=vectors)
    assert np.abs(floats - expected).max() <= 1e-5


def test_single_string_input_and_dimensions_renormalise(cde_server, topics):
    with cde_server.client() as client:
        body = {"model": MODEL, "input": QUERIES[0], "context": "topics", "input_type": "query"}
        full = embeddings(client.post("/v1/embeddings", json=body))
        cut = embeddings(client.post("/v1/embeddings", json={**body, "dimensions": 8}))
    assert full.shape == (1, 32) and cut.shape == (1, 8)
    # The model ends with Normalize: a Matryoshka prefix comes back unit length, pointing where the prefix points.
    assert np.linalg.norm(cut) == pytest.approx(1.0, abs=1e-6)
    assert np.abs(cut - full[:, :8] / np.linalg.norm(full[:, :8])).max() <= 1e-6


def test_truncated_inputs_are_counted(cde_server, topics):
    long_text = " ".join(["glacier"] * 100)
    with cde_server.client() as client:
        answer = client.post(
            "/v1/embeddings",
            json={"model": MODEL, "input": [long_text, "short", long_text], "context": "topics", "truncate": True},
        ).json()
    assert answer["truncated_inputs"] == 2
    assert answer["usage"]["prompt_tokens"] <= 3 * 32


def test_without_context_the_saved_default_context_is_used(cde_server, cde_model):
    with cde_server.client() as client:
        answer = client.post("/v1/embeddings", json={"model": MODEL, "input": QUERIES, "input_type": "query"})
        default = client.get("/v1/contexts/default").json()
    assert answer.json()["context"] == {"name": "default", "fingerprint": cde_model.context_info.fingerprint}
    assert default["fingerprint"] == cde_model.context_info.fingerprint and default["origin"] == "model"
    expected = cde_model.encode(QUERIES, prompt=cde_model.prompts["query"])  # the model's own saved context
    assert np.abs(embeddings(answer) - expected).max() <= 1e-5


def test_context_resources(cde_server, cde_model):
    with cde_server.client() as client:
        made = create(client, "resource-test", documents=SHORT_DOCS, size=4, seed=3)
        assert made.status_code == 201, made.text
        body = made.json()
        assert (body["name"], body["size"], body["seed"]) == ("resource-test", 4, 3)
        assert client.get("/v1/contexts/resource-test").json() == body
        assert "resource-test" in [c["name"] for c in client.get("/v1/contexts").json()["data"]]
        assert_error(create(client, "resource-test", documents=SHORT_DOCS), 409, "context_exists", "name")
        replaced = create(client, "resource-test", documents=TOPIC_DOCS, size=4, seed=3, replace=True)
        assert replaced.status_code == 201 and replaced.json()["fingerprint"] != body["fingerprint"]
        # size < J: the rest of the slots are the null context, as set_context(vectors) with fewer rows gives
        vectors = cde_model.embed_context(TOPIC_DOCS, seed=3)  # J = 8 rows, sampled differently: recompute with 4
        module = cde_model.contextual_module
        from cde_st.context import sample_context

        four = module.embed_context_texts([module.document_prompt + t for t in sample_context(TOPIC_DOCS, 4, 3)])
        got = embeddings(
            client.post("/v1/embeddings", json={"model": MODEL, "input": QUERIES, "context": "resource-test"})
        )
        assert np.abs(got - cde_model.encode(QUERIES, context_vectors=four)).max() <= 1e-5
        assert np.abs(got - cde_model.encode(QUERIES, context_vectors=vectors)).max() > 1e-4
        deleted = client.delete("/v1/contexts/resource-test")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert_error(client.get("/v1/contexts/resource-test"), 404, "context_not_found")
        assert_error(client.delete("/v1/contexts/resource-test"), 404, "context_not_found")
        query = {"model": MODEL, "input": "x", "context": "resource-test"}
        assert_error(client.post("/v1/embeddings", json=query), 404, "context_not_found", "context")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "../escape", "documents": ["a"]}, 400, "invalid_context_name"),
        ({"name": "..", "documents": ["a"]}, 400, "invalid_context_name"),
        ({"name": ".hidden", "documents": ["a"]}, 400, "invalid_context_name"),
        ({"name": "a" * 65, "documents": ["a"]}, 400, "invalid_context_name"),
        ({"name": "a b", "documents": ["a"]}, 400, "invalid_context_name"),
        ({"name": "default", "documents": ["a"]}, 409, "context_name_reserved"),
        ({"name": "big", "documents": ["a"], "size": CONTEXT_SIZE + 1}, 400, "context_too_large"),
        ({"name": "nodocs", "documents": []}, 400, None),
        ({"name": "baddoc", "documents": ["a", 3]}, 400, "invalid_type"),
        ({"name": "blank", "documents": [" ", "\n\t"]}, 400, "empty_input"),  # not a 500 from the library
        ({"name": "seed", "documents": ["a"], "seed": -1}, 400, None),
    ],
)
def test_bad_context_requests(cde_server, body, status, code):
    with cde_server.client() as client:
        assert_error(client.post("/v1/contexts", json=body), status, code)
        assert (
            body["name"] not in [c["name"] for c in client.get("/v1/contexts").json()["data"]]
            or body["name"] == "default"
        )


def test_path_traversal_is_never_a_file(cde_server):
    with cde_server.client() as client:
        for path in ["/v1/contexts/..%2F..%2Fetc%2Fpasswd", "/v1/contexts/.lock", "/v1/contexts/%2E%2E"]:
            assert client.get(path).status_code in (400, 404)
            assert client.delete(path).status_code in (400, 404)


def test_concurrent_creates_of_one_name_give_one_201_and_one_409(cde_server):
    statuses = []
    barrier = threading.Barrier(2)

    def post():
        with cde_server.client() as client:
            barrier.wait()
            statuses.append(create(client, "raced").status_code)

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(statuses) == [201, 409]


BAD_EMBEDDINGS = [
    ({"model": MODEL, "input": []}, 400, "empty_input", "input"),
    ({"model": MODEL, "input": ""}, 400, "empty_input", "input"),
    ({"model": MODEL, "input": ["ok", ""]}, 400, "empty_input", "input[1]"),
    ({"model": MODEL, "input": ["ok", 3]}, 400, "invalid_type", "input[1]"),
    ({"model": MODEL, "input": {"text": "x"}}, 400, "invalid_type", "input"),
    ({"model": MODEL, "input": [1, 2, 3]}, 400, "token_ids_unsupported", "input"),
    ({"model": MODEL, "input": [[1, 2], [3]]}, 400, "token_ids_unsupported", "input"),
    ({"model": MODEL, "input": ["x"] * 65}, 400, "too_many_inputs", "input"),
    ({"model": MODEL}, 400, None, "input"),
    ({"input": "x"}, 400, None, "model"),
    ({"model": "gpt-4", "input": "x"}, 404, "model_not_found", "model"),
    ({"model": MODEL, "input": "x", "context": "nope"}, 404, "context_not_found", "context"),
    ({"model": MODEL, "input": "x", "context": 5}, 400, "invalid_type", "context"),
    ({"model": MODEL, "input": "x", "dimensions": 0}, 400, "invalid_dimensions", "dimensions"),
    ({"model": MODEL, "input": "x", "dimensions": 33}, 400, "invalid_dimensions", "dimensions"),
    ({"model": MODEL, "input": "x", "dimensions": "8"}, 400, "invalid_dimensions", "dimensions"),
    ({"model": MODEL, "input": "x", "dimensions": True}, 400, "invalid_dimensions", "dimensions"),
    ({"model": MODEL, "input": "x", "encoding_format": "hex"}, 400, None, "encoding_format"),
    ({"model": MODEL, "input": "x", "input_type": "passage"}, 400, None, "input_type"),
]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"), BAD_EMBEDDINGS, ids=[str(i) for i in range(len(BAD_EMBEDDINGS))]
)
def test_bad_embedding_requests(cde_server, body, status, code, param):
    with cde_server.client() as client:
        assert_error(client.post("/v1/embeddings", json=body), status, code, param)


def test_bad_bodies_and_keys(cde_server):
    with cde_server.client() as client:
        post = client.post
        assert_error(
            post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}),
            400,
            "invalid_json",
        )
        assert_error(
            post("/v1/embeddings", content=b"[1, 2]", headers={"content-type": "application/json"}), 400, "invalid_json"
        )
        assert_error(post("/v1/embeddings", content=b'{"model": "x"}', headers={"content-type": "text/plain"}), 415)
        assert_error(post("/v1/embeddings", data={"model": MODEL, "input": "x"}), 415)
        big = {"model": MODEL, "input": ["word " * 60_000]}  # ~300 kB > the 0.25 MiB limit
        assert_error(post("/v1/embeddings", json=big), 413, "request_too_large")
        assert_error(post("/v1/contexts", json={"name": "huge", "documents": ["word " * 60_000]}), 413)
        assert_error(client.get("/v1/nothing-here"), 404)
        assert_error(client.put("/v1/embeddings", json={}), 405)
    for key in (None, "wrong-key", API_KEY + "x"):
        with cde_server.client(key=key) as client:
            assert_error(client.post("/v1/embeddings", json={"model": MODEL, "input": "x"}), 401, "invalid_api_key")
            assert_error(client.get("/v1/contexts"), 401)
            assert_error(client.get("/metrics"), 401)
            assert client.get("/health").status_code == 200  # probes need no key
    with httpx.Client(base_url=cde_server.url, headers={"Authorization": API_KEY}) as client:  # no "Bearer"
        assert_error(client.get("/v1/models"), 401)


def test_models_health_and_metrics(cde_server):
    client = OpenAI(base_url=f"{cde_server.url}/v1", api_key=API_KEY, max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL] and models.data[0].object == "model"
    assert client.models.retrieve(MODEL).id == MODEL
    with cde_server.client() as http:
        http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
        text = http.get("/metrics").text
    for name in (
        "cde_st_requests_total",
        "cde_st_errors_total",
        "cde_st_batch_size_texts_bucket",
        "cde_st_queue_depth_texts",
        "cde_st_forward_seconds_count",
        "cde_st_request_latency_seconds_bucket",
        "cde_st_forwards_total",
    ):
        assert name in text
    assert 'cde_st_requests_total{endpoint="embeddings",status="200"}' in text
    overhead = re.search(r"^cde_st_forward_overhead_tokens (\S+)$", text, re.MULTILINE)
    assert overhead and float(overhead.group(1)) >= 1.0  # measured at start


def test_plain_model_is_served_and_refuses_contexts(plain_dir, start_server):
    from sentence_transformers import SentenceTransformer

    # A long batching wait and a queue of two texts make the overload case deterministic on this server.
    server = start_server(plain_dir, "--max-queue", "2", "--max-wait-ms", "1500", "--max-batch-size", "64",
                          "--forward-overhead-tokens", "12")  # fmt: skip
    model = SentenceTransformer(plain_dir)
    with server.client(key=None) as client:
        assert "cde_st_forward_overhead_tokens 12.0" in client.get("/metrics").text  # as given, not measured
        answer = client.post("/v1/embeddings", json={"model": "tiny-plain", "input": SHORT_DOCS[:2]})
        assert np.abs(embeddings(answer) - model.encode(SHORT_DOCS[:2])).max() <= 1e-5
        assert "context" not in answer.json()
        cut = embeddings(client.post("/v1/embeddings", json={"model": "tiny-plain", "input": "x", "dimensions": 4}))
        assert np.abs(cut - model.encode(["x"])[:, :4]).max() <= 1e-5  # no Normalize: a plain prefix
        refused = client.post("/v1/embeddings", json={"model": "tiny-plain", "input": "x", "context": "default"})
        assert "not a contextual model" in assert_error(refused, 400, "context_unsupported", "context")["message"]
        assert_error(client.post("/v1/contexts", json={"name": "c", "documents": ["a"]}), 400, "context_unsupported")

        async def overload():
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as aclient:
                first = asyncio.create_task(
                    aclient.post("/v1/embeddings", json={"model": "tiny-plain", "input": ["a", "b"]})
                )
                # wait until the first request's two texts wait in the queue for their batch to fill
                deadline = time.monotonic() + 10
                while "cde_st_queue_depth_texts 2.0" not in (await aclient.get("/metrics")).text:
                    assert time.monotonic() < deadline, "the first request never queued"
                    await asyncio.sleep(0.01)
                second = await aclient.post("/v1/embeddings", json={"model": "tiny-plain", "input": "c"})
                return await first, second

        first, second = asyncio.run(overload())
        assert first.status_code == 200
        assert_error(second, 429, "queue_full")
        assert int(second.headers["retry-after"]) >= 1


@pytest.mark.parametrize("clients", [32])
def test_load_many_concurrent_clients(cde_server, cde_model, topics, clients):
    """``clients`` concurrent clients for a bounded time (and a bounded count of requests each), mixing contexts,
    input types and request sizes: no error, every answer is the one its own texts should get."""
    _, topic_vectors = topics
    contexts = {"topics": topic_vectors, "default": cde_model.contextual_module.context_vectors}
    pool = [f"load text {i}: " + TOPIC_DOCS[i % len(TOPIC_DOCS)][: 20 + i % 30] for i in range(64)]
    prompts = {"query": cde_model.prompts["query"], "document": cde_model.prompts["document"]}
    expected = {
        (name, kind): cde_model.encode(pool, prompt=prompts[kind], context_vectors=vectors)
        for name, vectors in contexts.items()
        for kind in prompts
    }
    seconds, max_requests = 3.0, 400  # long enough for every client to send several requests

    async def one_client(i: int, aclient: httpx.AsyncClient) -> int:
        rng = np.random.default_rng(i)
        done, stop = 0, time.monotonic() + seconds
        while time.monotonic() < stop and done < max_requests:
            name = ("topics", "default")[int(rng.integers(2))]
            kind = ("query", "document")[int(rng.integers(2))]
            picked = rng.choice(len(pool), size=int(rng.integers(1, 5)), replace=False)
            body = {"model": MODEL, "input": [pool[j] for j in picked], "context": name, "input_type": kind}
            response = await aclient.post("/v1/embeddings", json=body)
            got = embeddings(response)
            assert response.json()["context"]["name"] == name
            assert np.abs(got - expected[(name, kind)][picked]).max() <= 1e-5, (i, done)
            done += 1
        return done

    async def run() -> list[int]:
        limits = httpx.Limits(max_connections=clients)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=cde_server.url, headers=headers, limits=limits, timeout=60) as aclient:
            return await asyncio.gather(*(one_client(i, aclient) for i in range(clients)))

    counts = asyncio.run(asyncio.wait_for(run(), timeout=seconds + 60))
    assert min(counts) >= 1 and sum(counts) >= clients
    with cde_server.client() as client:
        metrics = client.get("/metrics").text
    # Batching happened: some forward coalesced more than one request.
    batched = [line for line in metrics.splitlines() if line.startswith("cde_st_batch_size_requests_bucket")]
    at_one = next(float(line.split()[-1]) for line in batched if 'le="1.0"' in line)
    total = next(float(line.split()[-1]) for line in batched if 'le="+Inf"' in line)
    assert total > at_one
    print(f"load test: {sum(counts)} requests from {clients} clients in <= {seconds} s; {json.dumps(counts)}")
