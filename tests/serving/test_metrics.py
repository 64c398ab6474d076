"""The server's Prometheus metrics (cde_st/serving/metrics.py): one registry per server, the names it exports."""

from __future__ import annotations

from cde_st.serving.metrics import Metrics, QueueMetrics


def test_each_server_has_its_own_registry_and_exports_what_it_counts():
    first, second = Metrics(), Metrics()  # a second server in the same process does not collide
    first.requests.labels("embeddings", "200").inc()
    queue = QueueMetrics(first.registry)  # a batcher's, exported with its server's
    queue.observe_batch(n_texts=12, n_requests=3)
    queue.queue_depth.set(5)
    first.observe_forwards(4)
    first.observe_forwards(6)  # the engine's running count: the counter follows it
    text = first.render().decode()
    assert 'cde_st_requests_total{endpoint="embeddings",status="200"} 1.0' in text
    assert "cde_st_batch_size_texts_sum 12.0" in text and "cde_st_batch_size_requests_sum 3.0" in text
    assert "cde_st_queue_depth_texts 5.0" in text
    assert "cde_st_forwards_total 6.0" in text
    assert 'cde_st_requests_total{endpoint="embeddings"' not in second.render().decode()
    assert first.content_type.startswith("text/plain")
