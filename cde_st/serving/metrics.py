"""Prometheus metrics of one server, in a registry of its own (several apps in one process do not collide): the
server's (:class:`Metrics`) and its batcher's (:class:`QueueMetrics`, which the batcher keeps itself)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


__all__ = ["BATCH_BUCKETS", "LATENCY_BUCKETS", "Metrics", "QueueMetrics"]


class QueueMetrics:
    """What a :class:`~cde_st.serving.batching.DynamicBatcher` observes of its queue and its forwards, in
    ``registry`` (the server's; None: one of its own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.batch_texts = Histogram(
            "cde_st_batch_size_texts",
            "Texts per batch (run as one forward pass or more).",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "cde_st_batch_size_requests",
            "Requests coalesced into one batch.",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.forward_seconds = Histogram(
            "cde_st_forward_seconds",
            "Time of one forward pass (tokenising and the model) in the model thread.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "cde_st_queue_depth_texts", "Texts waiting for a forward pass.", registry=self.registry
        )
        self.abandoned_texts = Counter(
            "cde_st_abandoned_texts",
            "Texts of requests whose clients left while they were queued (never computed).",
            registry=self.registry,
        )

    def observe_batch(self, n_texts: int, n_requests: int) -> None:
        self.batch_texts.observe(n_texts)
        self.batch_requests.observe(n_requests)


class Metrics:
    """The server's own metrics (requests, errors, latency, texts and tokens answered, the context cache, the
    forward passes and their cost), the engine's brought level at each scrape; the batcher's are in the same
    registry (:class:`QueueMetrics`)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "cde_st_requests",
            "HTTP requests answered, by endpoint and status.",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "cde_st_errors",
            "Requests answered with an error, by endpoint and error code.",
            ["endpoint", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cde_st_request_latency_seconds",
            "Time from a request's arrival to its answer.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.texts = Counter("cde_st_embedded_texts", "Texts embedded.", registry=self.registry)
        self.cached_contexts = Gauge(
            "cde_st_context_cache_contexts", "Contexts whose keys/values are kept in memory.", registry=self.registry
        )
        self.cached_bytes = Gauge(
            "cde_st_context_cache_bytes", "Bytes of context keys/values kept in memory.", registry=self.registry
        )
        self.cache_budget = Gauge(
            "cde_st_context_cache_budget_bytes", "The budget for context keys/values.", registry=self.registry
        )
        self.cache_evictions = Counter(
            "cde_st_context_cache_evictions",
            "Contexts whose keys/values were dropped to stay within the budget.",
            registry=self.registry,
        )
        self._evictions_seen = 0
        self.tokens = Counter("cde_st_embedded_tokens", "Tokens read by the model.", registry=self.registry)
        self.forwards = Counter(
            "cde_st_forwards",
            "Forward passes of the model (the warm-up's included); a batch is cut into several by length where "
            "padding costs more.",
            registry=self.registry,
        )
        self._forwards_seen = 0
        self.forward_overhead = Gauge(
            "cde_st_forward_overhead_tokens",
            "What one more forward pass costs, in padded tokens (0: batches are not cut by length).",
            registry=self.registry,
        )

    def observe_context_cache(self, stats) -> None:
        """The engine's live set of context keys/values (a :class:`~cde_st.serving.context_cache.CacheStats`)."""
        self.cached_contexts.set(stats.contexts)
        self.cached_bytes.set(stats.bytes)
        self.cache_budget.set(stats.budget)
        self.cache_evictions.inc(stats.evictions - self._evictions_seen)
        self._evictions_seen = stats.evictions

    def observe_forwards(self, forwards: int) -> None:
        """The engine's count of forward passes so far (:attr:`~cde_st.serving.engine.Engine.forwards`)."""
        self.forwards.inc(forwards - self._forwards_seen)
        self._forwards_seen = forwards

    def render(self) -> bytes:
        return generate_latest(self.registry)
