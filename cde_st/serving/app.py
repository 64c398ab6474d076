"""The HTTP routes: OpenAI's ``/v1/embeddings`` and ``/v1/models``, the context resources ``/v1/contexts``,
``/health`` (alive), ``/ready`` (warmed up, model process up, not draining), ``/metrics``, and their description at ``/openapi.json``
and ``/docs``.

Bodies are read and validated here (not by FastAPI's models) so that every fault, including malformed JSON, a
wrong content type and an oversized body, is answered in OpenAI's error shape with the status OpenAI would use.
Every route but ``/health``, ``/ready`` and the description needs the API key when one is configured (``Authorization: Bearer KEY``, compared in
constant time).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from cde_st import context_errors
from cde_st.serving import defaults
from cde_st.serving.batching import DynamicBatcher, Overloaded, Unavailable
from cde_st.serving.contexts import ContextStore, check_name
from cde_st.serving.engine import Engine
from cde_st.serving.errors import ApiError
from cde_st.serving.forwards import Batch
from cde_st.serving.metrics import Metrics
from cde_st.serving.openapi import route_docs
from cde_st.serving.readiness import Readiness
from cde_st.serving.requests import check_content_type, parse_context, parse_embeddings, parse_json
from cde_st.serving.tokens import Tokens
from cde_st.serving.traffic import Traffic, TrafficState

logger = logging.getLogger(__name__)


@dataclass
class Settings:
    """The app's request and batching limits; the defaults are cde-st-serve's (:mod:`cde_st.serving.defaults`)."""

    api_key: str | None = None
    max_batch_size: int = defaults.MAX_BATCH_SIZE
    max_wait_ms: float = defaults.MAX_WAIT_MS
    max_queue: int = defaults.MAX_QUEUE
    max_inputs: int = defaults.MAX_INPUTS
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    max_batch_tokens: int | None = defaults.MAX_BATCH_TOKENS
    truncate: bool = defaults.TRUNCATE  # what a request without "truncate" gets
    # What one more forward costs in padded tokens ("auto": measured at warm-up; None: forwards kept full).
    forward_overhead_tokens: float | str | None = defaults.FORWARD_OVERHEAD_TOKENS


def _json(status: int, body: dict, headers: dict | None = None) -> Response:
    # json.dumps of plain lists: embeddings go out as shortest-repr floats, exact float32 once parsed back.
    return Response(
        json.dumps(body, separators=(",", ":")), status_code=status, headers=headers, media_type="application/json"
    )


def _error(error: ApiError) -> Response:
    return _json(error.status, error.body(), error.headers)


# The HTTP status of each fault the context store and the engine report (first match wins).
_CONTEXT_STATUSES = (
    (context_errors.InvalidContextName, 400),
    (context_errors.ContextTooLarge, 400),
    (context_errors.ContextNotFound, 404),
    (context_errors.NonFiniteEmbedding, 500),
    (context_errors.ContextError, 409),  # exists, busy, reserved, made by another model, damaged
)


def _context_error(error: context_errors.ContextError) -> ApiError:
    status = next(status for kind, status in _CONTEXT_STATUSES if isinstance(error, kind))
    return ApiError(status, error.message, param=error.param, code=error.code)


class _Service:
    """What the routes share: the engine, the context store, the batcher, the metrics and the settings; the
    request checks every route runs, and the handlers themselves."""

    def __init__(self, engine: Engine, store: ContextStore, settings: Settings) -> None:
        self.engine, self.store, self.settings = engine, store, settings
        self.metrics = Metrics()
        self.batcher = DynamicBatcher(
            _engine_forward(engine),
            engine.executor,
            max_batch_size=settings.max_batch_size,
            max_wait=settings.max_wait_ms / 1000,
            max_queue=settings.max_queue,
            max_batch_tokens=settings.max_batch_tokens,
            registry=self.metrics.registry,  # the batcher's metrics are exported beside the server's
        )
        self.readiness = Readiness(
            engine,
            settings.forward_overhead_tokens,
            self.metrics.forward_overhead.set,
            lambda: self.resolve_context(None),
        )
        self._warned_agents: set[str] = set()
        self.api_key = settings.api_key.encode("utf-8") if settings.api_key else None

    # ------------------------------------------------------------------ what every route runs
    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "Missing API key: send it as 'Authorization: Bearer KEY'.", code="invalid_api_key")
        if not hmac.compare_digest(given.strip().encode("utf-8"), self.api_key):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def read_json(self, request: Request) -> dict:
        content_type = request.headers.get("content-type")
        check_content_type(content_type)  # refused before a large body is read
        limit = self.settings.max_body_bytes
        too_large = ApiError(413, f"The request body exceeds {limit} bytes.", code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        raw = b"".join(chunks)
        if len(raw) < _PARSE_ON_LOOP_BYTES:
            return parse_json(raw, content_type)
        return await asyncio.to_thread(parse_json, raw, content_type)  # megabytes of JSON: off the event loop

    def route(self, endpoint: str, handler, authenticated: bool = True):
        """Count, time and error-wrap one endpoint; an ApiError becomes OpenAI's error body, anything else a 500
        with the traceback in the log (never in the answer)."""
        metrics = self.metrics

        @functools.wraps(handler)
        async def wrapped(request: Request, *args, **kwargs):
            started = time.perf_counter()
            try:
                if authenticated:
                    self.check_key(request)
                response = await handler(request, *args, **kwargs)
            except (ApiError, context_errors.ContextError) as error:
                if isinstance(error, context_errors.ContextError):
                    error = _context_error(error)
                response = _error(error)
                metrics.errors.labels(endpoint, error.code or error.type).inc()
            except Exception:
                logger.exception("%s failed", endpoint)
                response = _error(ApiError(500, "Internal server error (see the server log).", code="internal"))
                metrics.errors.labels(endpoint, "internal").inc()
            metrics.requests.labels(endpoint, str(response.status_code)).inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
            return response

        return wrapped

    def resolve_context(self, name: str | None):
        engine = self.engine
        if not engine.contextual:
            if name is not None:
                raise ApiError(
                    400,
                    f"Model {engine.served_name!r} is not a contextual model: contexts do not apply to it. Leave out "
                    "the 'context' field.",
                    param="context",
                    code="context_unsupported",
                )
            return None
        return self.store.default() if name is None else self.store.get(name)

    def require_contextual(self) -> None:
        if not self.engine.contextual:
            raise ApiError(
                400,
                f"Model {self.engine.served_name!r} is not a contextual model: it has no contexts.",
                code="context_unsupported",
            )

    # ------------------------------------------------------------------ /v1/embeddings
    async def embeddings(self, request: Request) -> Response:
        engine = self.engine
        body = parse_embeddings(await self.read_json(request), self.settings.max_inputs, engine.dimension)
        if body.model != engine.served_name:
            raise ApiError(
                404,
                f"The model {body.model!r} does not exist; this server serves {engine.served_name!r}.",
                param="model",
                code="model_not_found",
            )
        context = self.resolve_context(body.context)
        batch: Batch = await _unless_disconnected(request, self._embed(body, context))
        rows = _embedding_rows(batch.embeddings, body.dimensions, engine.normalizes, body.encoding_format)
        tokens = int(batch.tokens.sum())
        self.metrics.texts.inc(len(rows))
        self.metrics.tokens.inc(tokens)
        answer = {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
            "model": engine.served_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "truncated_inputs": int(batch.truncated.sum()),
        }
        if context is not None:
            answer["context"] = {"name": context.name, "fingerprint": context.fingerprint}
        return _json(200, answer, self._input_type_warning(request, body.input_type))

    def _input_type_warning(self, request: Request, input_type: str | None) -> dict | None:
        """Without ``input_type`` a text is embedded as a document. OpenAI clients (LangChain's OpenAIEmbeddings,
        LlamaIndex's OpenAIEmbedding) send the same body for queries, so a query would silently get the document
        prompt: say so in a header on each such answer and once per client (User-Agent) in the log."""
        if input_type is not None or self.engine.prompt_for("query") == self.engine.prompt_for(None):
            return None
        agent = request.headers.get("user-agent", "unknown")
        if agent not in self._warned_agents and len(self._warned_agents) < 100:
            self._warned_agents.add(agent)
            logger.warning(
                "Requests from %r give no input_type: they are embedded as documents (the model's default prompt). "
                'Queries need "input_type": "query" (LangChain/LlamaIndex OpenAI embeddings: one object per '
                "input type).",
                agent,
            )
        return {"X-CDE-ST-Warning": _NO_INPUT_TYPE}

    async def _embed(self, body, context) -> Batch:
        """Tokenise (in the tokenizer thread), refuse an over-long input unless truncating, then batch."""
        if sum(map(len, body.texts)) <= _INLINE_TOKENIZE_CHARS:
            tokens = self.engine.tokenize_inline(body.texts, body.input_type)  # well under a millisecond
        else:
            loop = asyncio.get_running_loop()
            tokens = await loop.run_in_executor(
                self.engine.tokenizer_executor, self.engine.tokenize, body.texts, body.input_type
            )
        truncate = self.settings.truncate if body.truncate is None else body.truncate
        if not truncate and tokens.truncated.any():
            raise _too_long(tokens, self.engine.max_seq_length, single=body.single)
        try:
            return await self.batcher.submit((context, body.input_type), tokens)
        except Overloaded as exc:
            raise ApiError(
                429,
                f"The server is overloaded: {exc}",
                code="queue_full",
                headers={"Retry-After": str(exc.retry_after)},
            ) from None
        except Unavailable as exc:
            raise ApiError(503, str(exc), code="unavailable", headers={"Retry-After": str(exc.retry_after)}) from None

    # ------------------------------------------------------------------ /v1/contexts
    async def create_context(self, request: Request) -> Response:
        self.require_contextual()
        body = parse_context(await self.read_json(request))
        self.store.reserve(body.name, body.replace)
        try:
            # the first stage runs in the model's worker one batch at a time, between embedding batches
            # A creation lets queued embeddings go first.
            waiting = lambda: self.batcher.pending  # noqa: E731
            context = await self.engine.create_context(body.name, body.documents, body.size, body.seed, waiting)
        except BaseException:
            self.store.release(body.name)
            raise
        await asyncio.to_thread(self.store.commit, context)
        return _json(201, context.describe())

    async def list_contexts(self, request: Request) -> Response:
        self.require_contextual()
        return _json(200, {"object": "list", "data": [c.describe() for c in self.store.list()]})

    async def get_context(self, request: Request, name: str) -> Response:
        self.require_contextual()
        return _json(200, self.store.get(check_name(name)).describe())

    async def delete_context(self, request: Request, name: str) -> Response:
        self.require_contextual()
        await asyncio.to_thread(self.store.delete, name)
        return _json(200, {"object": "context", "name": name, "deleted": True})

    # ------------------------------------------------------------------ /v1/models, /health, /metrics
    def model_card(self) -> dict:
        engine = self.engine
        card = {
            "id": engine.served_name,
            "object": "model",
            "created": engine.created,
            "owned_by": "cde_st",
            "contextual": engine.contextual,
            "dimensions": engine.dimension,
        }
        if engine.contextual:
            card["context_size"] = engine.context_size
        return card

    async def list_models(self, request: Request) -> Response:
        return _json(200, {"object": "list", "data": [self.model_card()]})

    async def get_model(self, request: Request, model_id: str) -> Response:
        if model_id != self.engine.served_name:
            raise ApiError(404, f"The model {model_id!r} does not exist.", param="model", code="model_not_found")
        return _json(200, self.model_card())

    async def health(self, request: Request) -> Response:
        return _json(200, {"status": "ok", "model": self.engine.served_name})

    async def ready(self, request: Request) -> Response:
        """200 once the model has answered a warm-up forward and, with a model process, while it runs; 503 before,
        while a new model process starts, and while draining (the middleware answers those), so a load balancer
        sends nothing to a replica that cannot answer (:mod:`cde_st.serving.readiness`)."""
        problem = self.readiness.problem()
        if problem is not None:
            raise ApiError(503, problem, code="not_ready", headers={"Retry-After": "1"})
        return _json(200, {"status": "ready", "model": self.engine.served_name})

    async def prometheus(self, request: Request) -> Response:
        if self.engine.contextual:
            self.metrics.observe_context_cache(self.engine.cache_stats())
        self.metrics.observe_forwards(self.engine.forwards)
        return Response(self.metrics.render(), media_type=self.metrics.content_type)


def _engine_forward(engine: Engine):
    """The batcher's forward: a batch's key is (context, input type), and its tokens carry the input type's prompt
    already, so the engine needs the context only."""

    def forward(key: tuple, parts: list[Tokens]) -> Batch:
        return engine.embed_tokens(parts, key[0])

    return forward


def _embedding_rows(vectors, dimensions: int | None, normalizes: bool, encoding_format: str) -> list:
    """(n, d) float32 embeddings -> the response's rows: truncated to ``dimensions`` (Matryoshka; renormalised
    when the model normalises, as a prefix of a unit vector is not unit length), as float lists or base64."""
    if dimensions is not None and dimensions < vectors.shape[1]:
        vectors = vectors[:, :dimensions]
        if normalizes:
            norms = (vectors.astype("float64") ** 2).sum(axis=1, keepdims=True) ** 0.5
            vectors = (vectors / norms.clip(min=1e-12)).astype("float32")
    if encoding_format == "base64":
        return [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
    return vectors.tolist()


_NO_INPUT_TYPE = 'no input_type: embedded as a document; send "input_type": "query" for queries'
_INLINE_TOKENIZE_CHARS = 2048  # a request of at most this many characters is tokenised on the event loop
_PARSE_ON_LOOP_BYTES = 256 * 1024  # bodies above this are parsed in a thread, so other requests keep flowing


def _too_long(tokens: Tokens, max_length: int, single: bool) -> ApiError:
    """OpenAI's refusal of an input longer than the model reads, naming the first such input and its length."""
    i = int(tokens.truncated.argmax())
    where = "input" if single else f"input[{i}]"
    length = f"at least {tokens.counted[i]}" if tokens.cut[i] else str(tokens.counted[i])
    return ApiError(
        400,
        f"Invalid '{where}': maximum context length is {max_length} tokens, however it has {length} tokens. Shorten "
        f'it, or send "truncate": true to embed its first {max_length} tokens.',
        param=where,
        code="context_length_exceeded",
    )


async def _unless_disconnected(request: Request, work):
    """``work`` (a coroutine), cancelled if the client goes away first: a queued request then never reaches a
    forward (the batcher skips cancelled requests). The body has been read, so the next ASGI message is the
    disconnect."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        raise ApiError(499, "The client closed the connection.", code="client_closed")
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: Engine, store: ContextStore, settings: Settings | None = None) -> FastAPI:
    """The server's ASGI app for one model (``engine``) and its contexts (``store``)."""
    service = _Service(engine, store, settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.batcher.start()
        await service.readiness.warm_up()
        watch = asyncio.create_task(service.readiness.watch())  # restarts a model process that ended
        try:
            yield
        finally:
            watch.cancel()
            await service.batcher.stop()
            engine.close()

    # The routes read their own bodies; their request and answer shapes are given per route (openapi.py).
    app = FastAPI(title="cde-st-serve", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.engine, app.state.store, app.state.service = engine, store, service
    app.state.traffic = TrafficState()
    app.add_middleware(Traffic, state=app.state.traffic)
    app.state.batcher, app.state.metrics = service.batcher, service.metrics
    routes = [
        ("POST", "/v1/embeddings", "embeddings", service.embeddings),
        ("POST", "/v1/contexts", "contexts.create", service.create_context),
        ("GET", "/v1/contexts", "contexts.list", service.list_contexts),
        ("GET", "/v1/contexts/{name}", "contexts.get", service.get_context),
        ("DELETE", "/v1/contexts/{name}", "contexts.delete", service.delete_context),
        ("GET", "/v1/models", "models", service.list_models),
        ("GET", "/v1/models/{model_id:path}", "models.get", service.get_model),
        ("GET", "/metrics", "metrics", service.prometheus),
    ]
    for method, path, endpoint, handler in routes:
        app.add_api_route(path, service.route(endpoint, handler), methods=[method], **route_docs(method, path))
    for path, endpoint, handler in [("/health", "health", service.health), ("/ready", "ready", service.ready)]:
        app.add_api_route(
            path, service.route(endpoint, handler, authenticated=False), methods=["GET"], **route_docs("GET", path)
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # unknown paths (404) and methods (405) answer in the same error shape as everything else
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code))

    return app
